"""A failure that repeats identically at startup is not relaunched, and says why (issue 23,
part 7). Reproduced on the old main: a tokenizer larger than `model.vocab_size` (and a TP plan
that does not fit the model) failed training four times, with only `ended 'no result.json':
exit 1` on the console and the cause in the rank logs.
"""

from __future__ import annotations

from dataclasses import replace

from pipelines.launchers import Verdict, get_launcher, run_with_retries
from tests.infra.launch_helpers import make_trainer_job, result


def test_startup_failure_on_two_ranks_is_not_relaunched_and_names_its_first_error_line(tmp_path):
    # The spec is built without the cross-field rules (as a hand-written spec.resolved.json
    # would be): the trainer itself meets the oversized tokenizer.
    job, spec = make_trainer_job(tmp_path, procs=2, max_restarts=3)
    data = spec.model_dump(mode="json")
    assert data["model"]["vocab_size"] == 320
    import json

    data["model"]["vocab_size"] = 256  # the BPE has 256 bytes + specials + merges: more than 256 rows
    job.spec_path.write_text(json.dumps(data))
    lines: list[str] = []
    outcome = run_with_retries(get_launcher("local"), replace(job, max_restarts=3), on_log=lines.append)
    assert outcome.attempts == 1, outcome.decisions
    assert outcome.decisions[0].verdict is Verdict.GIVE_UP
    done = result(job.run_dir)
    assert done["status"] == "failed" and done["stop_reason"] == "startup_failure"
    assert "TrainingError: tokenizer has" in done["error"] and "model.vocab_size is 256" in done["error"]
    assert "failed before the first step" in done["reason"]
