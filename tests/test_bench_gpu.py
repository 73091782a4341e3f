"""``ctpore bench gpu`` for a short lease: every step in its own process with a timeout, the JSON
rewritten after each step, a failed or timed-out step recorded with its reason while the next one
runs. CUDA is mocked in this process only (the steps are stand-in commands, or real children that
find no GPU); the checks themselves run here on CPU."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from ctpore.pipelines.bench import gpu as G

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

HAS_CUDA = torch.cuda.is_available()  # really, before any test mocks it


@pytest.fixture
def cuda_here(monkeypatch):
    """This process believes it has one GPU (the bench itself never makes a CUDA context)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_each_step_is_written_as_it_ends_and_failures_and_timeouts_are_recorded(tmp_path, monkeypatch, capsys,
                                                                                 cuda_here):
    from ctpore.app.cli import main
    from ctpore.pipelines.bench.speed import gpu_section

    out, late = tmp_path / "res" / "gpu.json", tmp_path / "late"
    py = sys.executable
    hang = tmp_path / "hang.py"
    hang.write_text("import subprocess, sys, time\n"
                    f"code = {f'import pathlib, time; time.sleep(1.5); pathlib.Path({str(late)!r}).touch()'!r}\n"
                    "subprocess.Popen([sys.executable, '-c', code])\n"
                    "time.sleep(60)\n")
    stand_ins = {
        "versions": [py, "-c", "print('a line before the result'); print('{\"gpu\": \"stand-in\"}')"],
        # what the JSON file held when the second step ran: the first step, already written
        "kernels": [py, "-c", f"import json; d = json.load(open({str(out)!r})); "
                              "print(json.dumps({'seen': sorted(d['steps'])}))"],
        "sdpa_kernel": [py, "-c", "import sys; sys.stderr.write('Traceback (most recent call last):\\n  ...\\n"
                                  "RuntimeError: no kernel for these inputs\\n'); sys.exit(1)"],
        # hangs, with a grandchild that would leave a file if it outlived the timeout
        "model": [py, str(hang)],
        "speed": [py, "-c", "print('no json here')"],
    }
    real = G.step_command
    monkeypatch.setattr(G, "step_command", lambda step, args: stand_ins.get(step) or real(step, args))
    monkeypatch.setitem(G.STEP_TIMEOUTS, "model", 1)
    with pytest.raises(SystemExit) as exc:  # scan and reconstruct are the real steps
        main(["bench", "gpu", "--workdir", str(tmp_path / "work"), "-o", str(out), "--reconstruct-shape", "8x40x40",
              "--time-limit", "150"])
    assert exc.value.code == 3  # some steps failed
    res = json.loads(out.read_text())
    assert list(res["steps"]) == ["versions", "kernels", "sdpa_kernel", "model", "speed", "scan", "reconstruct"]
    assert res["versions"] == {"gpu": "stand-in"} and res["kernels"] == {"seen": ["versions"]}
    errors = {e["step"]: e["error"] for e in res["errors"]}
    assert errors["sdpa_kernel"] == "RuntimeError: no kernel for these inputs"  # the one line that says why
    assert errors["model"] == "timed out after 1 s"
    assert errors["speed"] == "no result: the step printed no JSON result"
    assert "scan" not in errors and res["scan"]["shape"] == [8, 40, 40]
    if HAS_CUDA:  # the real reconstruct child ran on the GPU
        assert res["reconstruct"]["voxels"] == 8 * 40 * 40 and "reconstruct" not in errors
    else:  # it finds no GPU on this machine: its own one-line error is the reason
        assert errors["reconstruct"].startswith("ctpore: error:") and "no usable CUDA GPU" in errors["reconstruct"]
    assert set(errors) - {"reconstruct"} == {"sdpa_kernel", "model", "speed"}
    assert not late.exists()  # the timed-out step was killed with its whole process group
    assert not (tmp_path / "work" / "scan_8x40x40.nii").exists()  # the generated scan is removed
    printed = capsys.readouterr().out
    assert "model        FAILED" in printed and "timed out after 1 s" in printed
    section = "\n".join(gpu_section(res))  # the performance page takes a partial run
    assert "on stand-in" in section and "- step `model` did not finish: timed out after 1 s" in section


def test_a_spent_time_limit_records_every_step_not_run(tmp_path, cuda_here):
    out = tmp_path / "gpu.json"
    res = G.bench_gpu(tmp_path / "work", out, time_limit=0)
    assert json.loads(out.read_text()) == res
    assert [s["ok"] for s in res["steps"].values()] == [False] * 7
    assert {e["error"] for e in res["errors"]} == {"not run: the time limit of 0 s was spent",
                                                   "not run: there is no test scan (step scan failed)"}


def test_without_cuda_the_bench_is_a_usage_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from ctpore.errors import InputError

    with pytest.raises(InputError, match="no usable CUDA GPU"):
        G.bench_gpu(tmp_path, tmp_path / "gpu.json")
    assert not (tmp_path / "gpu.json").exists()


def test_the_gpu_checks_run_here_on_cpu_and_measure_what_they_say(capsys, no_window_kernel):
    """Each check also runs on CPU, so its code is exercised before it first meets a GPU. The checks
    compare PyTorch's kernels (sdpa, flash, math), so ctpore's CPU-only C kernel is off (it never
    runs on CUDA)."""
    from ctpore.pipelines import gpu_checks as C
    from ctpore.pipelines.precision import precision_name

    C.main(["versions", '{"device": "cpu"}'])
    v = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert v["torch"] == torch.__version__ and v["device"] == "cpu"
    assert v["flash_attn"]["importable"] is (v["flash_attn"]["why_not"] is None)  # and says why not
    k = C.kernel_agreement({"device": "cpu", "columns": 24, "chunk": 6})
    for case in k.values():
        assert case["math_bf16_error"] > 1e-3  # bf16 really is coarser than fp32 here
        assert case["sdpa"]["within_twice_math"] and case["sdpa"]["ran"] == {"sdpa": 2}
        assert case["flash"]["available"] is False and "flash" in case["flash"]["why"]
        assert case["sdpa_kernels"]["math"]["within_twice_math"]
    assert k["full_resolution"]["n_kv_heads"] == 1 and k["levels"]["window"] == 24  # the shipped model's
    s = C.sdpa_kernel_ran({"device": "cpu", "shape": [4, 32, 32]})
    assert s["operators"] and set(s["operators"]) <= set(C.SDPA_OPERATORS) and s["accepted_when_forced"]["math"]
    assert s["ran"] == "+".join(C.SDPA_OPERATORS[o] for o in s["operators"])
    m = C.model_agreement({"device": "cpu", "shape": [6, 48, 48]})
    assert m["sdpa_fp32_error"] < 1e-5  # the kernels agree in fp32
    assert m["math"]["max_abs_error_bf16"] > m["sdpa_fp32_error"] and m["sdpa"]["ran"] == "sdpa"
    sp = C.model_speed({"device": "cpu", "shape": [6, 40, 40]})
    assert sp["voxels_per_s"] > 0 and sp["ran"] == "sdpa" and sp["estimate_gb"] > 0
    assert sp["precision"] == precision_name("auto", torch.device("cpu"))  # what runs here by default
    from ctpore.pipelines.bench.speed import gpu_section

    text = "\n".join(gpu_section({"versions": v, "kernels": k, "sdpa_kernel": s, "model": m, "speed": sp,
                                  "errors": []}))
    assert f"| attention kernel (full resolution, bf16) | {k['full_resolution']['math_bf16_error']:.2e} |" in text
    assert f"{m['sdpa']['max_abs_error_bf16']:.2e}" in text and f"{sp['voxels_per_s']:.3g}" in text
    assert f"inside the model: {s['ran']} (profiler)" in text and "did not finish" not in text


def test_the_reconstruct_step_reports_the_whole_process(tmp_path, no_window_kernel):
    """The step's command and its figures, run here on CPU (the bench runs it with --device cuda)."""
    shape = [8, 40, 40]
    scan = G.make_test_scan(tmp_path / "scan_8x40x40.nii", tuple(shape))
    args = {"scan": str(scan), "outdir": str(tmp_path / "out"), "device": "cpu", "memory_gb": 2.0,
            "gpu_memory_gb": None, "shape": shape}
    rc, _out, err = G.run_step(G.step_command("reconstruct", args), 120)
    assert rc == 0, err
    res = G.reconstruct_result(args, err, 4.0)
    assert res["voxels"] == 8 * 40 * 40 and res["voxels_per_s"] == 8 * 40 * 40 / 4.0
    assert res["attention_backend"] == "sdpa" and res["device"] == "cpu"
    if G.step_command("reconstruct", args)[0] == "/usr/bin/time":
        assert 0.05 < res["peak_rss_gb"] < 8  # a Python process with torch, in GB


def test_tf32_off_turns_it_off_and_restores_it():
    from ctpore.pipelines.gpu_checks import tf32_off

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cudnn.allow_tf32 = True
    try:
        with tf32_off():
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before

