"""bench/gpu_check.py on a CPU: its dry run goes through every check's code (FSDP2 on a 1-rank gloo group, the
in-process actor, weight sync into HFEngine, decode against transformers.generate, padded and packed updates, a
GRPO step of the Trainer, dense retrieval encoding through rlloom.retrieval), so a GPU session finds a script that
runs; plus its deadline, missing-pydantic and MFU
arithmetic, and that its budgets fit the deadline the documented device command gives it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
CHECK_NAMES = [
    "env",
    "fsdp2_api",
    "nccl_vs_inprocess",
    "bf16_fp32_masters",
    "weight_sync",
    "engine_decode",
    "update_3b",
    "mfu_update",
    "shared_prompt",
    "grpo_step",
    "retrieval_encoding",
]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def run(*args: str, prelude: str = "", timeout: float = 600) -> subprocess.CompletedProcess[str]:
    code = f"{prelude}import runpy, sys; sys.argv = {[str(SCRIPT), *args]!r}; "
    code += f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def checks(report_path: Path) -> dict[str, dict[str, object]]:
    report = json.loads(report_path.read_text())
    return {c["name"]: c for c in report["checks"]}


def test_dry_run_passes_every_check_it_can_on_a_cpu(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = run("--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = checks(out)
    assert list(found) == CHECK_NAMES
    statuses = {name: c["status"] for name, c in found.items()}
    assert statuses == {**dict.fromkeys(CHECK_NAMES, "PASS"), "mfu_update": "SKIP"}, proc.stdout
    for name in CHECK_NAMES:
        assert any(line.startswith(f"{statuses[name]} {name} ") for line in proc.stdout.splitlines())

    actors = found["nccl_vs_inprocess"]["figures"]
    assert isinstance(actors, dict)
    # one rank sums nothing across ranks: the FSDP2 step is the in-process step up to bf16 rounding
    assert actors["logprob_absdiff_max"] <= 0.1
    assert abs(actors["grad_norm_ratio_fsdp_over_inproc"] - 1) <= 0.05
    # auto without flash-attn: packed rows through sdpa_varlen (per-sequence sdpa on a CPU), no dense mask
    assert actors["packed_attention"] == "sdpa_varlen: causal sdpa per sequence"
    assert actors["packed_vs_padded_grad_cosine"] >= 0.99
    masters = found["bf16_fp32_masters"]["figures"]
    assert isinstance(masters, dict)
    assert masters["inproc_param_dtypes"] == masters["fsdp_param_dtypes"] == "torch.float32"
    assert masters["inproc_matmul_out_dtype"] == masters["fsdp_matmul_out_dtype"] == "torch.bfloat16"
    # an lr-1e-5 AdamW step on ~0.02-sized weights is below half a bf16 step for most of them
    assert masters["share_moved_fp32_masters"] > masters["share_moved_if_bf16_storage"]
    sync = found["weight_sync"]["figures"]
    assert isinstance(sync, dict)
    assert sync["fsdp_max_abs_err_vs_bf16_of_actor"] == sync["inproc_max_abs_err_vs_bf16_of_actor"] == 0.0
    decode = found["engine_decode"]["figures"]
    assert isinstance(decode, dict)
    assert {"rows8_engine_over_generate", "rows16_engine_over_generate"} <= set(decode)
    update = found["update_3b"]["figures"]
    assert isinstance(update, dict)
    assert update["real_tokens"] < update["padded_tokens"]
    assert "no bf16 dense peak" in str(found["mfu_update"]["note"])
    mfu = found["mfu_update"]["figures"]
    assert isinstance(mfu, dict)
    assert {"padded_achieved_TFLOP_s", "packed_achieved_TFLOP_s"} <= set(mfu) and "6*N*T" in mfu["flops_formula"]
    assert mfu["packed_attention"] == update["packed_attention"]
    grpo = found["grpo_step"]["figures"]
    assert isinstance(grpo, dict)
    assert grpo["step_s"] > 0 and grpo["grad_norm"] > 0 and "non_finite" not in grpo
    assert 0.0 <= grpo["reward_mean"] <= 1.0
    shared = found["shared_prompt"]["figures"]
    assert isinstance(shared, dict)
    for layout in ("even", "long_prompt"):
        assert shared[f"{layout}_token_ratio"] > 1  # eight samples a prompt: the shared forward runs fewer tokens
        assert shared[f"{layout}_max_abs_logprob_gap_bf16"] <= 0.1
        assert shared[f"{layout}_model_calls_full"] == 1 and shared[f"{layout}_model_calls_shared"] == 2
    encoding = found["retrieval_encoding"]["figures"]
    assert isinstance(encoding, dict)
    # 100 words of which 28 split in two, 'passage' ':', [CLS] [SEP]: HotpotQA's 132 tokens a passage under
    # bert-base-uncased (bench/retrieval_encoding.py); queries 18 + 4 + 2 + 2
    assert encoding["mean_passage_tokens"] == 100 + 28 + 2 + 2 == 132
    assert encoding["mean_query_tokens"] == 18 + 4 + 2 + 2
    assert encoding["vector_dim"] == 64  # the tiny encoder's hidden size; e5 preset: unit vectors
    assert abs(encoding["vector_norm_min"] - 1) <= 1e-3 and abs(encoding["vector_norm_max"] - 1) <= 1e-3
    for label in ("fp32", "fp16_cast", "bf16_cast"):
        rate, queries = encoding[f"{label}_passages_per_s"], encoding[f"{label}_queries_per_s"]
        assert encoding[f"{label}_wiki18_hours"] == pytest.approx(21_015_324 / rate / 3600)
        assert encoding[f"{label}_turn_2560_queries_s"] == pytest.approx(2560 / queries)
    assert encoding["fp16_cast_min_cosine_vs_fp32"] >= 0.99 and encoding["bf16_cast_min_cosine_vs_fp32"] >= 0.99


def test_past_the_deadline_every_check_is_skipped_not_run(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = run("--dry-run", "--deadline-s", "0", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = checks(out)
    assert list(found) == CHECK_NAMES
    assert all(c["status"] == "SKIP" and "deadline" in str(c["note"]) for c in found.values())


def test_missing_pydantic_names_the_wheels_to_carry(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = run("--dry-run", "--out", str(out), prelude="import sys; sys.modules['pydantic'] = None; ")
    assert proc.returncode == 2
    lines = [line for line in proc.stdout.splitlines() if "pydantic" in line]
    assert len(lines) == 1
    for wheel in ("pydantic-core", "typing-inspection", "annotated-types", "rich", "scripts/gpu_wheels.py"):
        assert wheel in lines[0]
    assert checks(out)["env"]["status"] == "FAIL"


def test_retrieval_encoding_without_sentence_transformers_skips_naming_the_wheels(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    prelude = "import sys; sys.modules['sentence_transformers'] = None; "
    proc = run("--dry-run", "--only", "retrieval_encoding", "--out", str(out), prelude=prelude)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = checks(out)["retrieval_encoding"]
    assert check["status"] == "SKIP" and check["figures"]["missing"] == "sentence_transformers"
    assert "scripts/gpu_wheels.py --retrieval" in str(check["note"])


def test_e5_shaped_tokenizer_has_bert_base_vocabulary_and_splits_as_designed() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_checks_retrieval as retrieval

    vocab, stems, pieces = retrieval.vocabulary(30_522, 1000)
    assert len(vocab) == len(set(vocab)) == 30_522 and vocab[:4] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    # 17 = 0x0011 over a..p; 123 over q..z, three digits: "rst"
    assert (stems[0], stems[17], pieces[0], pieces[123]) == ("aaaa", "aabb", "qqq", "rst")
    tokenizer = retrieval.wordpiece_tokenizer(1000, 100)
    assert tokenizer.tokenize("passage: AABB aabbqrs aaaa") == ["passage", ":", "aabb", "aabb", "##qrs", "aaaa"]
    text = retrieval.texts(3, 10, 4, (stems, pieces), seed=0)
    assert all(len(t.split()) == 10 and sum(len(w) > 4 for w in t.split()) == 4 for t in text)


def test_bf16_peaks_by_device_name() -> None:
    script = load_script()
    assert script.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert script.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert script.peak_flops("NVIDIA H200") == 989e12
    assert script.peak_flops("NVIDIA A100-SXM4-80GB") is None


def test_mfu_flops_follow_the_stated_formula() -> None:
    import torch

    script = load_script()
    ctx = script.Context(torch.device("cpu"), script.TINY_SIZES, True, deadline=0.0)
    ctx.shared["update"] = {
        "seconds": {"packed": 2.0, "padded": 4.0},
        "params": 10,
        "real_tokens": 4,
        "sum_sq_lengths": 8,
        "layers": 2,
        "hidden": 3,
    }
    with pytest.raises(script.SkipCheckError) as caught:  # a CPU has no stated peak: figures come with the skip
        script.check_mfu_update(ctx)
    figures = caught.value.args[1]
    flops = 6 * 10 * 4 + 6 * 2 * 3 * 8  # 6 N T + 6 L d sum(T_i^2) = 240 + 288
    assert figures["update_TFLOPs"] == pytest.approx(flops / 1e12)
    assert figures["packed_achieved_TFLOP_s"] == pytest.approx(flops / 2.0 / 1e12)
    assert figures["padded_achieved_TFLOP_s"] == pytest.approx(flops / 4.0 / 1e12)


def test_runs_from_the_working_tree_sources_when_rlloom_is_not_installed(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    hide = "import sys; sys.path[:] = [p for p in sys.path if '/packages/' not in p]; "
    proc = run("--dry-run", "--only", "env", "--out", str(out), prelude=hide)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["rlloom_core_rl_from"] == str(ROOT / "packages" / "core-rl" / "src" / "rlloom" / "core_rl")


def test_budgets_fit_inside_the_default_deadline() -> None:
    """Every check can run when the launcher hands the script its default deadline (docs/gpu_check.md)."""
    script = load_script()
    assert [name for name, _ in script.CHECKS] == CHECK_NAMES == list(script.BUDGET_S)
    assert sum(script.BUDGET_S.values()) <= script.DEFAULT_DEADLINE_S


def run_launcher(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """bench/gpu_check.sh with this interpreter (pydantic and rich present, no carried wheels: nothing to install,
    even where a developer's checkout has .whl/gpu from scripts/gpu_wheels.py)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHON": sys.executable,
        "OUT": str(out),
        "GPU_CHECK_WHEELS": str(out / "no-wheels"),
    }
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_launcher_gives_the_check_a_deadline_inside_the_device_timeout(tmp_path: Path) -> None:
    proc = run_launcher(tmp_path, "--timeout-s", "200", "--dry-run", "--only", "env")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    deadline = float(report["argv"][report["argv"].index("--deadline-s") + 1])
    assert 200 - 60 - 10 <= deadline <= 200 - 60  # the timeout less the margin and the seconds already spent
    assert "PASS env" in (tmp_path / "gpu_check.log").read_text()


def test_launcher_refuses_a_timeout_too_short_for_any_check(tmp_path: Path) -> None:
    proc = run_launcher(tmp_path, "--timeout-s", "80", "--dry-run")
    assert proc.returncode == 2
    assert "give the device call more time" in proc.stdout
