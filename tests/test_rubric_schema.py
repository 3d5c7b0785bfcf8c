"""The rubric's schema (grader.rubric.RUBRIC_SCHEMA) is its truth: a key it has no place for is
refused at load, naming the key, where it is, the closest valid key, and where a misplaced key
belongs; every shipped rubric fits it."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grader.rubric import RUBRIC_SCHEMA, Limits, RubricError, load_rubric, schema_problems

from conftest import ROOT

SHIPPED = [ROOT / "rubrics" / "linear_attention.yaml", ROOT / "rubrics" / "linear_attention_hyena.yaml",
           ROOT / "bench" / "rubrics" / "small_questions.yaml"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_rubric_fits_the_schema(path):
    assert schema_problems(yaml.safe_load(path.read_text())) == []


def _broken(tmp_path: Path, change) -> Path:
    raw = yaml.safe_load(SHIPPED[0].read_text())
    change(raw)
    path = tmp_path / "rubric.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("change, said", [
    (lambda r: r.update(baseline=["scaffold_present"]),
     "unknown key `baseline` at the top level; `baseline` belongs in `items[]`"),
    (lambda r: r["items"][2].update(poitns=1), "unknown key `poitns` in `items[2]`; did you mean `points`?"),
    (lambda r: r["limits"].update(cpu_second=3), "unknown key `cpu_second` in `limits`; did you mean `cpu_seconds`?"),
    (lambda r: r["written"]["questions"][0]["criteria"][1].update(earn="x"),
     "unknown key `earn` in `written.questions[0].criteria[1]`; did you mean `earns`?"),
    (lambda r: r["written"]["rerun"]["MEMORY_BILL"]["agree"][0].update(field=["a"]),
     "unknown key `field` in `written.rerun.MEMORY_BILL.agree[0]`; did you mean `fields`?"),
    (lambda r: r.update(memory_bill=r["settings"].pop("memory_bill")),
     "unknown key `memory_bill` at the top level"),
])
def test_a_key_the_schema_has_no_place_for_is_refused_where_it_is(tmp_path, change, said):
    with pytest.raises(RubricError, match="^" + str(tmp_path).replace(".", r"\.")) as raised:
        load_rubric(_broken(tmp_path, change))
    assert said in str(raised.value), str(raised.value)


def test_the_schema_knows_every_limit_the_grader_enforces():
    assert set(RUBRIC_SCHEMA.keys["limits"].keys) == set(Limits.__dataclass_fields__)
    assert all(field.doc for field in RUBRIC_SCHEMA.keys.values())
