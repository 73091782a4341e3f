/* Causal look-back-window attention with one key/value head, for PoreFormer's inference on CPU.
 *
 * Every pixel column is its own tiny attention problem: Zq query slices (H heads of size 16) over
 * the last W <= 32 key slices each (Hkv key/value heads; PoreFormer's full resolution has one and
 * W = 8, its coarse levels four and W = 24). PyTorch's CPU attention kernel computes every query against
 * every key of the chunk (and the cached ones) and masks, and spends most of its time in
 * per-problem overhead; this computes only the keys a query may see, one column at a time in
 * the cache, with GCC/Clang vector types (16 lanes: one AVX-512 register, two AVX2 ones). It is
 * loaded with ctypes (ctpore.models.window_kernel), whose calls release the GIL, so Python runs
 * ranges of columns in several threads.
 *
 * Layouts (elements, last axis contiguous):
 *   q, out  (N, Zq, H, 16), heads 16 apart, column stride q_sn / o_sn, slice stride q_sz / o_sz
 *           (H*16 when each column's slices are contiguous; N*H*16 in a slice-major layout);
 *   k, v    the last Zk - Zc key positions (N, Zk - Zc, Hkv, 16), column stride k_sn / v_sn, slice
 *           stride k_sz / v_sz, heads 16 apart;
 *   kp, vp  the first Zc positions (a KV cache's, read in place: no copy joins them to k, v), laid
 *           out as k, v with strides kp_sn, kp_sz / vp_sn, vp_sz (unused when Zc = 0).
 * Query i is key position p = Zk - Zq + i (bottom-right aligned, as after a KV cache) and attends
 * to positions max(0, p - W + 1) .. p. Scores and softmax are computed in fp32 whatever the
 * storage type; bf16 results are rounded to nearest even.
 *
 * Reference: ctpore.models.attention.MultiHeadAttention._math (the tests compare the two).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* One build, the best vector unit at run time (GCC on x86-64 Linux); elsewhere the compiler's default. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

#define D 16    /* head size */

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v16 load16_f32(const float *p) {
    v16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline v16 load16_bf16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, sizeof h);
    v16u u = __builtin_convertvector(h, v16u) << 16;
    return (v16)u;
}

static inline void store16_f32(float *p, v16 x) { memcpy(p, &x, sizeof x); }

static inline void store16_bf16(uint16_t *p, v16 x) {
    v16u u = (v16u)x;
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even (values here are finite) */
    v16h h = __builtin_convertvector(u >> 16, v16h);
    memcpy(p, &h, sizeof h);
}

/* e^x for x <= 0 (scores minus their maximum), 8 lanes: Cephes' expf polynomial, relative error
 * below 2e-7; lanes below -87 give e^-87 (they are masked or negligible). A lane that is not a
 * number (a NaN or an infinity in the input) is clamped into [-87, 0] before the conversion to an
 * integer, which is defined only for values that fit: its result is meaningless, never undefined. */
static inline v8 exp8(v8 x) {
    const v8 ok = x >= -87.0f; /* comparisons give -1 (true) / 0 lanes; false for NaN */
    x = (v8)(((v8i)x & (v8i)ok) | ((v8i)((v8){0} - 87.0f) & ~(v8i)ok));
    const v8 pos = x > 0.0f;
    x = (v8)((v8i)x & ~(v8i)pos); /* +inf or > 0: 0 */
    v8 t = x * 1.44269504088896341f - 0.5f;
    v8i n = __builtin_convertvector(t, v8i); /* toward zero: t - 0.5 rounds t to nearest for t <= 0 */
    v8 nf = __builtin_convertvector(n, v8);
    v8 r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    v8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (v8)((n + 127) << 23);
}

static inline float hmax8(v8 x) {
    float m = x[0];
    for (int j = 1; j < 8; j++) m = x[j] > m ? x[j] : m;
    return m;
}

static inline float hsum8(v8 x) {
    return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}

/* The heads of query i in groups of G (a constant), over LB blocks of 8 key lanes (a constant):
 * the groups' products, exponentials and sums are independent chains that the CPU overlaps.
 * Query head h reads key/value head h / rep. */
#define HEAD_GROUPS(G, LB, LOAD16, STORE16)                                                        \
    for (int64_t h0 = 0; h0 < H; h0 += G) {                                                        \
        v16 qh[G], a[G];                                                                           \
        v8 s[G][LB];                                                                               \
        const float *ktg[G];                                                                       \
        const v16 *vvg[G];                                                                         \
        for (int g = 0; g < G; g++) {                                                              \
            qh[g] = LOAD16(qi + (h0 + g) * D) * scale;                                             \
            ktg[g] = kt + ((h0 + g) / rep) * D * P + p;                                            \
            vvg[g] = vv + ((h0 + g) / rep) * P + p;                                                \
            for (int b = 0; b < LB; b++) s[g][b] = (v8){0};                                        \
        }                                                                                          \
        for (int d = 0; d < D; d++)                                                                \
            for (int g = 0; g < G; g++)                                                            \
                for (int b = 0; b < LB; b++) {                                                     \
                    v8 kd;                                                                         \
                    memcpy(&kd, ktg[g] + d * P + 8 * b, sizeof kd);                                \
                    s[g][b] += qh[g][d] * kd;                                                      \
                }                                                                                  \
        for (int g = 0; g < G; g++) {                                                              \
            float m = -3.0e38f;                                                                    \
            for (int b = 0; b < LB; b++) {                                                         \
                s[g][b] = (v8)(((v8i)s[g][b] & ~masked[b]) | ((v8i)((v8){0} - 3.0e38f) & masked[b])); \
                const float mb = hmax8(s[g][b]);                                                   \
                m = mb > m ? mb : m;                                                               \
            }                                                                                      \
            float tot = 0.0f;                                                                      \
            for (int b = 0; b < LB; b++) {                                                         \
                s[g][b] = (v8)((v8i)exp8(s[g][b] - m) & ~masked[b]);                               \
                tot += hsum8(s[g][b]);                                                             \
            }                                                                                      \
            const float inv = 1.0f / tot;                                                          \
            a[g] = (v16){0};                                                                       \
            for (int b = 0; b < LB; b++) s[g][b] *= inv;                                           \
        }                                                                                          \
        for (int b = 0; b < LB; b++)                                                               \
            for (int j = 0; j < 8; j++)                                                            \
                for (int g = 0; g < G; g++) a[g] += s[g][b][j] * vvg[g][8 * b + j];                \
        for (int g = 0; g < G; g++) STORE16(oi + (h0 + g) * D, a[g]);                              \
    }

/* Columns n0 .. n1-1, windows of at most 8 * LB slices. scratch: alloc_scratch. */
#define DEFINE_RUN(NAME, T, LOAD16, STORE16, LB)                                                   \
    CLONES static void NAME(const T *q, const T *k, const T *v, T *out, const T *kp, const T *vp,  \
                            int64_t n0, int64_t n1, int64_t Zq, int64_t Zk, int64_t Zc, int64_t H, \
                            int64_t Hkv, int64_t W, float scale, int64_t q_sn, int64_t q_sz,      \
                            int64_t k_sn, int64_t k_sz, int64_t v_sn, int64_t v_sz, int64_t o_sn,  \
                            int64_t o_sz, int64_t kp_sn, int64_t kp_sz, int64_t vp_sn, int64_t vp_sz, \
                            float *scratch) {                                                      \
        const int64_t L = 8 * LB;          /* key lanes of a query */                               \
        const int64_t P = Zk + L - 1;      /* key positions, with L - 1 empty ones in front */     \
        const int64_t rep = H / Hkv;                                                               \
        float *kt = scratch;               /* (Hkv, 16, P): keys transposed, scores run over lanes */ \
        v16 *vv = (v16 *)(scratch + Hkv * D * P); /* (Hkv, P): values */                           \
        const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};                                                 \
        memset(scratch, 0, sizeof(float) * 2 * Hkv * D * P);                                       \
        for (int64_t n = n0; n < n1; n++) {                                                        \
            for (int64_t z = 0; z < Zk; z++) {                                                     \
                const T *kz0 = z < Zc ? kp + n * kp_sn + z * kp_sz : k + n * k_sn + (z - Zc) * k_sz; \
                const T *vz0 = z < Zc ? vp + n * vp_sn + z * vp_sz : v + n * v_sn + (z - Zc) * v_sz; \
                for (int64_t hk = 0; hk < Hkv; hk++) {                                             \
                    v16 kz = LOAD16(kz0 + hk * D);                                                 \
                    for (int d = 0; d < D; d++) kt[(hk * D + d) * P + (L - 1) + z] = kz[d];        \
                    vv[hk * P + (L - 1) + z] = LOAD16(vz0 + hk * D);                               \
                }                                                                                  \
            }                                                                                      \
            for (int64_t i = 0; i < Zq; i++) {                                                     \
                const int64_t p = Zk - Zq + i; /* this query's key position; lanes p-L+1 .. p */  \
                int64_t first = (L - 1) - p; /* lanes before it: positions < 0 */                \
                if (L - W > first) first = L - W; /* or outside the window */                     \
                v8i masked[LB];                                                                    \
                for (int b = 0; b < LB; b++) masked[b] = (lane + 8 * b) < (v8i){0} + (int32_t)first; \
                const T *qi = q + n * q_sn + i * q_sz;                                             \
                T *oi = out + n * o_sn + i * o_sz;                                                 \
                if (H % 4 == 0) {                                                                  \
                    HEAD_GROUPS(4, LB, LOAD16, STORE16)                                            \
                } else {                                                                           \
                    HEAD_GROUPS(1, LB, LOAD16, STORE16)                                            \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_RUN(run_f32_1, float, load16_f32, store16_f32, 1)
DEFINE_RUN(run_f32_2, float, load16_f32, store16_f32, 2)
DEFINE_RUN(run_f32_3, float, load16_f32, store16_f32, 3)
DEFINE_RUN(run_f32_4, float, load16_f32, store16_f32, 4)
DEFINE_RUN(run_bf16_1, uint16_t, load16_bf16, store16_bf16, 1)
DEFINE_RUN(run_bf16_2, uint16_t, load16_bf16, store16_bf16, 2)
DEFINE_RUN(run_bf16_3, uint16_t, load16_bf16, store16_bf16, 3)
DEFINE_RUN(run_bf16_4, uint16_t, load16_bf16, store16_bf16, 4)

static float *alloc_scratch(int64_t Zk, int64_t Hkv, int64_t W) {
    const int64_t L = 8 * ((W + 7) / 8);
    return (float *)aligned_alloc(64, sizeof(float) * (size_t)(2 * Hkv * D * (Zk + L - 1) + 16));
}

/* The arguments the kernel is written for: a window of 1..32 slices, 1 <= Zq <= Zk queries and keys,
 * 0 <= Zc <= Zk of the keys in the cache's buffers (given when Zc > 0),
 * H a multiple of Hkv >= 1, columns 0 <= n0 <= n1. Anything else would read or write out of bounds
 * (the scratch is sized from W, a query reads Zk - Zq + i), so it is declined here, whatever the
 * caller checked. */
static int bad_args(int64_t n0, int64_t n1, int64_t Zq, int64_t Zk, int64_t Zc, int64_t H, int64_t Hkv, int64_t W,
                    const void *kp, const void *vp) {
    return W < 1 || W > 32 || Zq < 1 || Zk < Zq || H < 1 || Hkv < 1 || H % Hkv != 0 || n0 < 0 || n1 < n0 ||
           Zc < 0 || Zc > Zk || (Zc > 0 && (!kp || !vp));
}

/* One exported entry per storage type, head size 16. Returns 0; -1 when the scratch memory could
 * not be allocated; -2 for arguments it is not written for (bad_args), having touched nothing. */
#define RUN_ARGS q, k, v, out, kp, vp, n0, n1, Zq, Zk, Zc, H, Hkv, W, scale, q_sn, q_sz, k_sn, k_sz, v_sn, v_sz, \
                 o_sn, o_sz, kp_sn, kp_sz, vp_sn, vp_sz, scratch
#define DEFINE_EXPORT(NAME, T, RUN)                                                                \
    EXPORT int NAME(const T *q, const T *k, const T *v, T *out, const T *kp, const T *vp, int64_t n0, \
                    int64_t n1, int64_t Zq, int64_t Zk, int64_t Zc, int64_t H, int64_t Hkv, int64_t W, \
                    float scale, int64_t q_sn, int64_t q_sz, int64_t k_sn, int64_t k_sz, int64_t v_sn, \
                    int64_t v_sz, int64_t o_sn, int64_t o_sz, int64_t kp_sn, int64_t kp_sz, int64_t vp_sn, \
                    int64_t vp_sz) {                                                               \
        if (bad_args(n0, n1, Zq, Zk, Zc, H, Hkv, W, kp, vp)) return -2;                           \
        float *scratch = alloc_scratch(Zk, Hkv, W);                                                \
        if (!scratch) return -1;                                                                   \
        switch ((W + 7) / 8) {                                                                     \
            case 1: RUN##_1(RUN_ARGS); break;                                                      \
            case 2: RUN##_2(RUN_ARGS); break;                                                      \
            case 3: RUN##_3(RUN_ARGS); break;                                                      \
            default: RUN##_4(RUN_ARGS); break;                                                     \
        }                                                                                          \
        free(scratch);                                                                             \
        return 0;                                                                                  \
    }

DEFINE_EXPORT(ctpore_winattn_f32, float, run_f32)
DEFINE_EXPORT(ctpore_winattn_bf16, uint16_t, run_bf16)
