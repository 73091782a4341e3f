/* A standalone harness of the window attention kernel (models/_winattn.c), built by
 * tests/test_window_kernel.py with -fsanitize=address,undefined where the compiler supports it:
 * the kernel is loaded by ctypes into an uninstrumented Python there, so only a harness of its own
 * shows an out-of-bounds access or undefined behaviour.
 *
 * It checks: every argument the kernel is not written for is declined (-2) before anything is read
 * or written; a valid problem matches a plain reference; NaN and infinite inputs run without
 * undefined behaviour. Prints "ok" and exits 0, or names what failed and exits 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../models/_winattn.c"

static int failed = 0;

#define CHECK(cond, ...)                       \
    do {                                       \
        if (!(cond)) {                         \
            fprintf(stderr, __VA_ARGS__);      \
            fputc('\n', stderr);               \
            failed = 1;                        \
        }                                      \
    } while (0)

/* One column (N = 1), contiguous (Zq, H, 16) queries and (Zk, Hkv, 16) keys and values; the first Zc key
 * positions read through the cache's pointers (the same buffers: the kernel reads them in place). */
static int run_split(float *q, float *k, float *v, float *out, int64_t n0, int64_t n1, int64_t Zq, int64_t Zk,
                     int64_t Zc, int64_t H, int64_t Hkv, int64_t W, int null_past) {
    const int64_t off = (Zc > 0 && Zc <= Zk ? Zc : 0) * Hkv * D;
    return ctpore_winattn_f32(q, k + off, v + off, out, null_past ? NULL : k, null_past ? NULL : v, n0, n1, Zq, Zk,
                              Zc, H, Hkv, W, 0.25f, Zq * H * D, H * D, Zk * Hkv * D, Hkv * D, Zk * Hkv * D, Hkv * D,
                              Zq * H * D, H * D, Zk * Hkv * D, Hkv * D, Zk * Hkv * D, Hkv * D);
}

static int run(float *q, float *k, float *v, float *out, int64_t n0, int64_t n1, int64_t Zq, int64_t Zk, int64_t H,
               int64_t Hkv, int64_t W) {
    return run_split(q, k, v, out, n0, n1, Zq, Zk, 0, H, Hkv, W, 1);
}

static void reference(const float *q, const float *k, const float *v, float *out, int64_t Zq, int64_t Zk, int64_t H,
                      int64_t Hkv, int64_t W) {
    for (int64_t i = 0; i < Zq; i++) {
        int64_t p = Zk - Zq + i, lo = p - W + 1 < 0 ? 0 : p - W + 1;
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / (H / Hkv);
            double s[64], m = -1e300, tot = 0;
            for (int64_t j = lo; j <= p; j++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += (double)q[(i * H + h) * D + c] * k[(j * Hkv + hk) * D + c];
                s[j - lo] = 0.25 * d;
                if (s[j - lo] > m) m = s[j - lo];
            }
            for (int64_t j = lo; j <= p; j++) tot += (s[j - lo] = exp(s[j - lo] - m));
            for (int c = 0; c < D; c++) {
                double a = 0;
                for (int64_t j = lo; j <= p; j++) a += s[j - lo] / tot * v[(j * Hkv + hk) * D + c];
                out[(i * H + h) * D + c] = (float)a;
            }
        }
    }
}

int main(void) {
    enum { ZQ = 5, ZK = 12, H = 4, HKV = 2 };
    float *q = malloc(sizeof(float) * ZQ * H * D), *k = malloc(sizeof(float) * ZK * HKV * D);
    float *v = malloc(sizeof(float) * ZK * HKV * D), *out = malloc(sizeof(float) * ZQ * H * D);
    float *ref = malloc(sizeof(float) * ZQ * H * D);
    srand(7);
    for (int i = 0; i < ZQ * H * D; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < ZK * HKV * D; i++) k[i] = (float)rand() / RAND_MAX - 0.5f, v[i] = (float)rand() / RAND_MAX;

    /* declined, with exact-size buffers an overflow would hit */
    CHECK(run(q, k, v, out, 0, 1, ZQ, ZK, H, HKV, 0) == -2, "window 0 not declined");
    CHECK(run(q, k, v, out, 0, 1, ZQ, ZK, H, HKV, 33) == -2, "window 33 not declined");
    CHECK(run(q, k, v, out, 0, 1, ZK + 1, ZK, H, HKV, 8) == -2, "more queries than keys not declined");
    CHECK(run(q, k, v, out, 0, 1, 0, ZK, H, HKV, 8) == -2, "no query not declined");
    CHECK(run(q, k, v, out, 0, 1, ZQ, ZK, H, 0, 8) == -2, "Hkv 0 not declined");
    CHECK(run(q, k, v, out, 0, 1, ZQ, ZK, 3, HKV, 8) == -2, "H not a multiple of Hkv not declined");
    CHECK(run(q, k, v, out, 1, 0, ZQ, ZK, H, HKV, 8) == -2, "n1 < n0 not declined");
    CHECK(run_split(q, k, v, out, 0, 1, ZQ, ZK, ZK + 1, H, HKV, 8, 0) == -2, "more cached keys than keys not declined");
    CHECK(run_split(q, k, v, out, 0, 1, ZQ, ZK, -1, H, HKV, 8, 0) == -2, "a negative cache not declined");
    CHECK(run_split(q, k, v, out, 0, 1, ZQ, ZK, 4, H, HKV, 8, 1) == -2, "a cache without its buffers not declined");

    /* valid: every window size class against the reference */
    int windows[] = {1, 3, 8, 9, 16, 24, 32};
    for (unsigned w = 0; w < sizeof windows / sizeof *windows; w++) {
        CHECK(run(q, k, v, out, 0, 1, ZQ, ZK, H, HKV, windows[w]) == 0, "window %d failed", windows[w]);
        reference(q, k, v, ref, ZQ, ZK, H, HKV, windows[w]);
        double err = 0;
        for (int i = 0; i < ZQ * H * D; i++) err = fmax(err, fabs(out[i] - ref[i]));
        CHECK(err < 1e-5, "window %d: max error %g against the reference", windows[w], err);
        for (int64_t zc = 1; zc <= ZK - ZQ; zc += ZK - ZQ - 1) { /* the first keys read from a cache */
            CHECK(run_split(q, k, v, out, 0, 1, ZQ, ZK, zc, H, HKV, windows[w], 0) == 0, "window %d, cache failed",
                  windows[w]);
            err = 0;
            for (int i = 0; i < ZQ * H * D; i++) err = fmax(err, fabs(out[i] - ref[i]));
            CHECK(err < 1e-5, "window %d, %d cached keys: max error %g", windows[w], (int)zc, err);
        }
    }

    /* not a number in, no undefined behaviour (the sanitizer would stop the run) */
    q[3] = NAN, k[5] = INFINITY, v[7] = -INFINITY, q[40] = -INFINITY;
    CHECK(run(q, k, v, out, 0, 1, ZQ, ZK, H, HKV, 8) == 0, "non-finite input failed");

    free(q), free(k), free(v), free(out), free(ref);
    if (!failed) puts("ok");
    return failed;
}
