"""The op library under AddressSanitizer and UndefinedBehaviorSanitizer, and a bounded fuzz run
(issue 16, item 4): the CI job, reached from .ci/run through pytest.

One build (clang, -O1, into a temporary folder; CMake -DDIFFLITE_FUZZ=ON) compiles the library's
sources once into the sanitized libdifflite_delegate.so and the libFuzzer target fuzz_delegate
(custom_ops/fuzz/fuzz_delegate.cc: custom-option parsing, every op's node validation and CPU
kernel, the delegate's model walk), and the small target fuzz_program_cache
(custom_ops/fuzz/fuzz_program_cache.cc: the OpenCL program cache's entry parser, issue 35). Then,
the fuzzer on one core while the rest runs on the other:

* fuzz_delegate replays the regression corpus (custom_ops/fuzz/corpus/: every crash found so far)
  and fuzzes for FUZZ_SECONDS from it: any finding fails; fuzz_program_cache replays its seeds
  (custom_ops/fuzz/program_cache_corpus/) and fuzzes for CACHE_FUZZ_SECONDS;
* the hostile-file corpus (tests/support/hostile_tflite.py) through the sanitized library, CPU and
  OpenCL (PoCL) backends, in Python processes with the ASan runtime preloaded;
* the core cases of the op library's CPU backend tests (tests/test_op_*.py: every op against its
  float64 reference; tests/test_oplib_delegate.py: chains with delegate-owned tensors, refusals,
  corrupted options) on the sanitized library.

A sanitizer report anywhere (ASan: halt_on_error; UBSan: -fno-sanitize-recover=all) fails the
test that saw it. Budget: <= 150 s for the module on the 2-core CI machine, builds included.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import ROOT
from support import hostile_tflite as hostile

SOURCE = ROOT / "custom_ops"
CORPUS = SOURCE / "fuzz" / "corpus"
CACHE_CORPUS = SOURCE / "fuzz" / "program_cache_corpus"
FUZZ_SECONDS = 60
CACHE_FUZZ_SECONDS = 15  # a small parser: over a million inputs in that time
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}
CORE_FILES = ("test_op_group_norm.py", "test_op_gelu.py", "test_op_attention.py", "test_op_winograd.py",
              "test_op_lora.py", "test_oplib_delegate.py")
CORE_TESTS = ("litert and (test_group_norm or test_gelu or test_geglu or test_attention or "
              "test_winograd_conv3x3 or test_chain or test_builtin_between or test_fully_connected_rank_changes or "
              "test_two_slots_independent or test_errors_leave_the_factors) or test_refusal_does_not_crash or "
              "test_corrupted_options_never_crash or test_resize_input_reprepares_partition")


def find_clang() -> str:
    """clang++ (or the newest clang++-N on PATH) whose runtime has libFuzzer; a clear failure
    (never a skip) where there is none."""
    names = ["clang++"] + [f"clang++-{v}" for v in range(25, 13, -1)]
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        fuzzer = subprocess.run([path, "-print-file-name=libclang_rt.fuzzer-x86_64.a"], capture_output=True,
                                text=True).stdout.strip()
        if os.path.isabs(fuzzer) and os.path.exists(fuzzer):
            return path
    pytest.fail("no clang++ with libFuzzer's runtime: the sanitizer job needs clang (scripts/setup.sh --test "
                "installs it: apt-get install clang-15)")


def asan_runtime(clang: str) -> str:
    path = subprocess.run([clang, "-print-file-name=libclang_rt.asan-x86_64.so"], capture_output=True,
                          text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.fail(f"{clang} has no shared ASan runtime (libclang_rt.asan-x86_64.so)")
    return path


class Build:
    def __init__(self, folder: Path, clang: str, seconds: float):
        self.folder, self.clang, self.seconds = folder, clang, seconds
        self.library = folder / "libdifflite_delegate.so"
        self.fuzzer = folder / "fuzz_delegate"
        self.cache_fuzzer = folder / "fuzz_program_cache"
        # fuzz_delegate links ASan statically; Python gets the shared runtime preloaded.
        self.fuzz_env = {**os.environ, **SANITIZER_ENV,
                         "ASAN_SYMBOLIZER_PATH": shutil.which("llvm-symbolizer") or ""}
        self.env = {**self.fuzz_env, "LD_PRELOAD": asan_runtime(clang), "DIFFLITE_OPLIB": str(self.library),
                    "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Build:
    clang = find_clang()
    folder = tmp_path_factory.mktemp("sanitized")
    start = time.monotonic()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = [["cmake", "-S", str(SOURCE), "-B", str(folder), *generator, "-DCMAKE_BUILD_TYPE=None",
              f"-DCMAKE_CXX_COMPILER={clang}", "-DCMAKE_CXX_FLAGS=-O1 -gline-tables-only", "-DDIFFLITE_FUZZ=ON"],
             ["cmake", "--build", str(folder), "-j", str(os.cpu_count() or 2)]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(step)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = Build(folder, clang, time.monotonic() - start)
    assert result.library.exists() and result.fuzzer.exists() and result.cache_fuzzer.exists()
    print(f"\nsanitized build: {result.seconds:.1f} s")
    return result


@pytest.mark.parametrize("target", ["fuzz_delegate", "fuzz_program_cache"])
def test_regression_corpus_replays_cleanly(build, target):
    """Every crash the fuzzer ever found (custom_ops/fuzz/corpus/), and the program cache
    target's seeds, once each."""
    fuzzer, corpus = (build.fuzzer, CORPUS) if target == "fuzz_delegate" else (build.cache_fuzzer, CACHE_CORPUS)
    cases = sorted(corpus.iterdir())
    assert cases, f"{corpus} is empty"
    run = subprocess.run([str(fuzzer), "-close_fd_mask=2", *map(str, cases)], capture_output=True, text=True,
                         env=build.fuzz_env, timeout=120)
    assert run.returncode == 0, run.stderr[-6000:]
    assert run.stderr.count("Executed ") == len(cases), run.stderr[-3000:]


def start_fuzzer(fuzzer: Path, seconds: int, corpus: Path, work: Path, env: dict) -> subprocess.Popen:
    """`fuzzer` for `seconds` from the inputs of `corpus`, new ones in work/corpus, its findings
    and its log (work/fuzz.log) in `work`."""
    (work / "corpus").mkdir()
    # No RSS limit: libFuzzer reads its peak RSS from getrusage, which Linux carries across exec
    # from the forking process, so a pytest of 4.8 GB (the whole suite in CI) made the fuzzer
    # report out-of-memory on an empty input at once. A single allocation over 2 GB still fails.
    command = [str(fuzzer), f"-max_total_time={seconds}", "-close_fd_mask=2", "-rss_limit_mb=0",
               "-malloc_limit_mb=2048", "-print_final_stats=1", f"-artifact_prefix={work}/", str(work / "corpus"), str(corpus)]
    with open(work / "fuzz.log", "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


def assert_fuzzing_found_nothing(process: subprocess.Popen, seconds: int, work: Path) -> None:
    process.wait(timeout=seconds + 120)
    text = (work / "fuzz.log").read_text(errors="replace")
    artifacts = [p.name for p in work.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-"))]
    assert process.returncode == 0 and not artifacts, f"fuzzing found {artifacts}:\n{text[-8000:]}"
    stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", text))
    runs = int(stats.get("number_of_executed_units", 0))
    assert runs > 1000, text[-3000:]
    print(f"\n{Path(process.args[0]).name}: {runs} executions in {seconds} s ({stats.get('average_exec_per_sec')} / s), "
          f"{stats.get('new_units_added')} new inputs, no findings")


@pytest.fixture(scope="module")
def fuzzing(build, tmp_path_factory):
    """The bounded fuzz run, started now and awaited by test_bounded_fuzz_run_finds_nothing, so
    that the tests in between run beside it."""
    work = tmp_path_factory.mktemp("fuzz")
    process = start_fuzzer(build.fuzzer, FUZZ_SECONDS, CORPUS, work, build.fuzz_env)
    yield process, work
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_hostile_files_under_sanitizers(build, fuzzing, backend, tmp_path):
    cases = [c for c in hostile.CASES + hostile.random_cases(30) if c.delegate != "tflite"]
    folder = hostile.write_corpus(tmp_path / "corpus", cases)
    outcomes = hostile.run_children(build.library, backend, folder, ["seed", *(c.id for c in cases)], env=build.env)
    assert outcomes["seed"].stage == "ran", outcomes["seed"]
    problems = {c.id: hostile.delegate_problems(c, backend, outcomes[c.id]) for c in cases}
    problems = {k: v for k, v in problems.items() if v}
    assert not problems, "\n".join(f"{k}: {'; '.join(v)}" for k, v in problems.items())[:8000]


def test_core_delegate_tests_under_sanitizers(build, fuzzing):
    """The op library's own Python tests (each op against its reference, chains, refusals) with
    the sanitized library: DIFFLITE_OPLIB names it, the ASan runtime is preloaded."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-k", CORE_TESTS,
                          *(str(ROOT / "tests" / name) for name in CORE_FILES)],
                         capture_output=True, text=True, env=build.env, cwd=ROOT, timeout=600)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"{summary}\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 30, summary
    assert not any(mark in run.stdout + run.stderr for mark in hostile.SANITIZER_MARKS), run.stdout[-6000:]


def test_bounded_fuzz_run_finds_nothing(fuzzing):
    process, work = fuzzing
    assert_fuzzing_found_nothing(process, FUZZ_SECONDS, work)


def test_program_cache_fuzz_run_finds_nothing(build, tmp_path):
    """The entry parser, after the delegate's fuzz run (so the two do not share a core)."""
    process = start_fuzzer(build.cache_fuzzer, CACHE_FUZZ_SECONDS, CACHE_CORPUS, tmp_path, build.fuzz_env)
    try:
        assert_fuzzing_found_nothing(process, CACHE_FUZZ_SECONDS, tmp_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
