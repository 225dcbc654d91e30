"""scripts/gpu_check.py on a CPU-only machine: the dry run's structure, part isolation, the byte count, imports.

The GPU numbers come from running the script on a GPU machine; here its structure is checked: one dry run
(a subprocess: NUMBA_ENABLE_CUDASIM is read when numba is first imported, and the modules it loads must be
its own) writes every part's plan and the tiny CPU measurements, and the tests read what it wrote.
"""
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.helpers import ROOT
SCRIPT = ROOT / "scripts" / "gpu_check.py"
PARTS = ["ext", "adam_throughput", "stages", "offload", "activations"]

# Runs the dry run as `python scripts/gpu_check.py --out OUT --dry-run` would, recording which module first
# imported each module (a meta-path finder that looks up the stack and lets the real finders do the work).
PROBE = r"""
import json, runpy, sys

class Who:
    first = {}
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in self.first:
            f = sys._getframe(1)
            while f and f.f_code.co_filename.startswith("<frozen"):  # importlib's own frames
                f = f.f_back
            self.first[top] = (f.f_globals.get("__name__") or "?").split(".")[0] if f else "?"
        return None

before = {m.split(".")[0] for m in sys.modules}
who = Who()
sys.meta_path.insert(0, who)
sys.argv = [sys.argv[1], "--out", sys.argv[2], "--dry-run"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
    rc = 0
except SystemExit as e:
    rc = e.code
print(json.dumps({"rc": rc, "modules": sorted({m.split(".")[0] for m in sys.modules} - before),
                  "first_importer": who.first}))
"""


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_check():
    return load_script()


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}  # the dry run sets it itself
    proc = subprocess.run([sys.executable, "-c", PROBE, str(SCRIPT), str(out)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    strict = dict(parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    report = json.loads((out / "results.json").read_text(), **strict)
    return report, (out / "results.md").read_text(), probe, proc.stdout


@pytest.mark.slow
def test_the_dry_run_records_every_part_and_says_it_is_a_dry_run(dry_run):
    report, md, probe, stdout = dry_run
    assert probe["rc"] == 0, stdout[-3000:]
    assert report["dry_run"] is True and "no number in it is a GPU measurement" in report["note"]
    assert sorted(report["parts"]) == sorted(PARTS)
    for name, part in report["parts"].items():
        assert part["plan"], f"{name} recorded no plan"
        assert part["status"] != "failed", part.get("traceback")
        assert all(c["ok"] for c in part["checks"]), (name, [c for c in part["checks"] if not c["ok"]])
        assert f"## {name}: {part['status']}" in md
    assert report["parts"]["ext"]["status"] == "skipped: the CUDA extension: no CUDA"
    assert report["parts"]["offload"]["status"].startswith("partly skipped: the link timing")
    # the plan is the GPU's, whatever ran here: four sizes up to 1024M parameters, 1 and 100 tensors
    configs = report["parts"]["adam_throughput"]["plan"]["configs"]
    assert [(c["params"], c["tensors"]) for c in configs][-2:] == [("1024M", 1), ("1024M", 100)]
    assert "DRY RUN" in md.splitlines()[2] and "| part | status | seconds | checks passed |" in md
    for name in ("machine", "started", "finished", "command"):
        assert report[name]
    assert report["machine"]["torch"] == torch.__version__
    # the table's head: what kind of run, the machine, the date, torch's and CUDA's versions, the command
    assert "- **dry run on the CPU (no GPU measurement)**, started " + report["started"] in md
    assert f"- torch {torch.__version__} (CUDA {torch.version.cuda})" in md
    assert report["command"].startswith("python3 scripts/gpu_check.py --out ") and report["command"].endswith(
        " --dry-run") and f"- command: `{report['command']}`" in md


@pytest.mark.slow
def test_the_stages_ran_on_gloo_and_equal_adamw(dry_run):
    stages = dry_run[0]["parts"]["stages"]
    checks = {c["check"]: c for c in stages["checks"]}
    for stage in range(4):
        equal = checks[f"stage {stage}, 1 rank = torch AdamW"]
        assert equal["ok"] and equal["measured"] == 0.0  # one rank, same arithmetic: bit for bit
        assert checks[f"stage {stage}, 1 rank: model states held = formula (padded Ψ)"]["ok"]
    memory = next(t for t in stages["tables"] if t["title"].startswith("Model states"))
    assert [r[0] for r in memory["rows"]] == [0, 1, 2, 3]
    assert all(r[6] == 16 * r[3] for r in memory["rows"])  # fp32: 16 bytes per (padded) parameter on one rank


@pytest.mark.slow
def test_numba_cuda_kernel_in_the_simulator_equals_torch_adamw(dry_run):
    checks = dry_run[0]["parts"]["adam_throughput"]["checks"]
    sim = [c for c in checks if c["check"].startswith("numba.cuda (simulator) = torch")]
    assert [c["check"].split(" = ")[1] for c in sim] == ["torch AdamW, sizes (1, 7, 300)",
                                                        "torch Adam (L2), sizes (1, 7, 300)"]
    # the simulator evaluates in double and fma as multiply + add: close to torch, not bit-equal
    assert all(c["ok"] and 0 <= c["measured"] <= 1e-6 for c in sim), sim


def test_bytes_per_step_are_28_per_parameter(gpu_check):
    for n in (1, 7, 16 << 20, 1 << 30):
        assert gpu_check.adam_step_bytes(n) == 28 * n


@pytest.mark.slow
def test_throughput_rows_count_28_bytes_per_parameter(dry_run):
    table = dry_run[0]["parts"]["adam_throughput"]["tables"][0]
    cols = table["columns"]
    assert cols == ["params", "tensors", "method", "median ms", "min ms", "GB/s", "× copy", "bytes per step"]
    assert {r[2] for r in table["rows"]} == {"numba cuda", "torch foreach", "torch fused"}
    for n, _, _, median_ms, min_ms, gbs, _, nbytes in table["rows"]:
        assert nbytes == 28 * n and min_ms <= median_ms
        assert gbs == pytest.approx(nbytes / (median_ms / 1e3) / 1e9, rel=1e-9)


@pytest.mark.slow
def test_the_script_imports_only_torch_numpy_numba_stdlib_and_the_repo(dry_run):
    probe = dry_run[2]
    loaded, first = set(probe["modules"]), probe["first_importer"]
    for name in ("deepspeed", "cloudpickle", "matplotlib", "pytest", "nbval", "hypothesis", "IPython", "course"):
        assert name not in loaded, f"the dry run imported {name} (first by {first.get(name)})"
    ours = {"__main__", "zero_ref", "sim"}
    direct = {m for m in loaded if first.get(m) in ours and m not in sys.stdlib_module_names}
    assert direct <= {"torch", "numpy", "numba", "zero_ref", "sim"}, direct
    # everything else came in through those (torch's and numba's optional imports are theirs to guard)
    assert {"torch", "numba", "zero_ref", "sim"} <= loaded


def test_a_failing_part_is_recorded_and_the_others_still_run(gpu_check, tmp_path, monkeypatch):
    # main() sets it in os.environ; setenv first so that monkeypatch removes it again afterwards
    # (delenv of an absent name records nothing to undo, and the simulator flag then leaks into later tests)
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM")
    threads = torch.get_num_threads()
    try:
        rc = gpu_check.main(["--out", str(tmp_path), "--dry-run", "--parts", "ext,activations,offload",
                             "--fail-part", "ext,offload"])
    finally:
        torch.set_num_threads(threads)
    report = json.loads((tmp_path / "results.json").read_text())
    assert rc == 1 and list(report["parts"]) == ["ext", "activations", "offload"]
    ext, acts, offload = (report["parts"][n] for n in ("ext", "activations", "offload"))
    for part in (ext, offload):
        assert part["status"] == "failed" and part["plan"]
        assert "RuntimeError: injected failure in part" in part["traceback"] and "in part_" in part["traceback"]
    assert ext["plan"]["sizes"][0] == "1+7+33+1000"  # what it recorded before raising is kept
    assert acts["status"] == "ok" and [c["ok"] for c in acts["checks"]] == [True]  # between two failures
    md = (tmp_path / "results.md").read_text()
    assert "| ext | failed |" in md and "| offload | failed |" in md and "RuntimeError: injected failure" in md


def test_quick_runs_fewer_sizes_and_says_so(gpu_check, tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_check.PARTS, "adam_throughput", lambda part: part.plan(
        sizes=part.pick(gpu_check.THROUGHPUT_SIZES, gpu_check.QUICK_THROUGHPUT_SIZES, [256])))
    for quick in (False, True):
        gpu_check.main(["--out", str(tmp_path), "--parts", "ext,adam_throughput"] + ["--quick"] * quick)
        report = json.loads((tmp_path / "results.json").read_text())
        ext, adam = report["parts"]["ext"], report["parts"]["adam_throughput"]
        assert len(ext["plan"]["sizes"]) == (2 if quick else 4) and report["quick"] is quick
        # a run without CUDA that is not a dry run skips on the GPU plan; the dry run's tiny sizes are its own
        assert adam["plan"]["sizes"] == ([16 << 20, 256 << 20] if quick else [16 << 20, 64 << 20, 256 << 20, 1 << 30])
        assert ("(--quick)" in (tmp_path / "results.md").read_text()) is quick


def test_a_failing_check_fails_the_run(gpu_check, tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_check.PARTS, "ext", lambda part: part.check("one = two", False, 1, 2, "exact"))
    assert gpu_check.main(["--out", str(tmp_path), "--parts", "ext"]) == 1
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["parts"]["ext"]["status"] == "ok" and report["parts"]["ext"]["checks"][0]["ok"] is False
    assert "| one = two | FAIL | 1 | 2 | exact |" in (tmp_path / "results.md").read_text()


def test_unknown_parts_are_refused(gpu_check, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--out", str(tmp_path), "--parts", "ext,kernels"])
    assert e.value.code == 2 and "unknown part(s) kernels" in capsys.readouterr().err


def test_the_watchdog_writes_the_reports_and_names_where_it_stopped(gpu_check, tmp_path):
    report = {"machine": gpu_check.machine_facts(), "started": "now", "dry_run": True,
              "parts": {"stages": {"status": "running", "checks": [], "tables": []}}}
    codes = []
    gpu_check._watchdog(0.05, tmp_path, report, exit=codes.append)
    deadline = time.monotonic() + 10
    while not codes and time.monotonic() < deadline:
        time.sleep(0.02)
    assert codes == [3]
    written = json.loads((tmp_path / "results.json").read_text())
    stages = written["parts"]["stages"]
    assert stages["status"] == "timed out" and "stopped after 0 s in:" in stages["traceback"]
    assert "test_the_watchdog_writes_the_reports" in stages["traceback"]  # the main thread's stack
    assert threading.main_thread().is_alive()



@pytest.mark.slow
def test_the_summary_chapter_14_shows_is_the_reports_own(dry_run):
    from zero_ref.kernels import gpu_results

    report = dry_run[0]
    text = gpu_results.summary(report)
    assert text.splitlines()[0] == f"- **dry run on the CPU (no GPU measurement)**, started {report['started']}"
    assert f"command: `{report['command']}`" in text
    rows = report["parts"]["adam_throughput"]["tables"][0]["rows"]
    for n, t, method, median_ms, *_ in rows:
        assert f"{n:>8} {t:>8}  {method:<14}{median_ms:>10.3f}" in text
    assert "adam_throughput  ok; checks passed 2/2" in text
    # a GPU run's head names the GPU from the facts machine_facts() records on CUDA
    gpu_run = {**report, "dry_run": False, "quick": True,
               "machine": {**report["machine"], "gpu": "GPU-X", "gpu_count": 2, "capability": "9.0",
                           "gpu_memory_bytes": 80 * 2**30}}
    head = gpu_results.header(gpu_run)
    assert head[0] == f"- **stored measurement (--quick)**, started {report['started']}"
    assert head[1].startswith("- machine: GPU-X × 2, compute capability 9.0, 80 GiB; ")


def test_without_a_stored_measurement_the_chapter_says_so_and_gives_the_command(tmp_path):
    from zero_ref.kernels import gpu_results

    assert gpu_results.show(tmp_path) == (f"No GPU measurement is stored yet ({tmp_path / 'results.json'} does not "
                                          "exist). On a GPU machine: make gpu-check OUT=benchmarks/gpu")


def test_a_stored_measurement_is_a_real_one():
    from zero_ref.kernels import gpu_results

    stored = gpu_results.load()
    if stored is None:
        pytest.skip("no GPU measurement is stored yet (benchmarks/gpu/results.json)")
    assert not stored["dry_run"] and stored["machine"]["gpu"], "benchmarks/gpu holds a dry run, not a measurement"
    assert stored["machine"]["torch_cuda"] and stored["finished"] != "timed out"


def test_the_summary_leaves_out_the_rows_asked():
    from zero_ref.kernels import gpu_results

    stored = gpu_results.load()
    if stored is None:
        pytest.skip("no GPU measurement is stored yet (benchmarks/gpu/results.json)")
    rows = stored["parts"]["adam_throughput"]["tables"][0]["rows"]
    text = gpu_results.summary(stored, leave_out={("cuda ext", 100)})
    for n, t, method, median_ms, *_ in rows:
        line = f"{n >> 20}M {t:>8}  {method:<14}{median_ms:>10.3f}"
        assert (line in text) == ((method, t) != ("cuda ext", 100)), line
