"""The plan: one immutable object from model A and a request, the same for the command
line and the library; its checks made once, in Python's words, translated by the CLI."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from click.testing import CliRunner

import lmckit
from lmckit._errors import ParameterError
from lmckit.aligners import aligner_info
from lmckit.cli import main
from lmckit.formats._io import held_model
from lmckit.forms._choice import check_heads_request
from lmckit.models import create_model
from lmckit.plan import AlignRequest, plan_alignment
from lmckit.workflow import merge_pair
from lmckit.workflow._simplex import check_simplex_request

TINY_GPT2 = dict(vocab_size=17, n_layer=1, n_head=2, n_embd=8, context=8)


@pytest.fixture(scope="module")
def gpt2():
    module, params = create_model("gpt2", seed=0, **TINY_GPT2)
    return held_model(module)


def test_the_form_is_named_steps_worked_out_on_a(gpt2) -> None:
    plan = plan_alignment(gpt2, symmetry="orthogonal")
    assert plan.steps == ("rmsnorm", "circuits")  # identifiers, not display text
    assert plan.form.form == "RMSNorm form and circuit form"
    # the RMSNorm form's stream is centred: its rotations fix the mean direction
    residual = plan.form.spec["residual"]
    assert type(residual.group).__name__ == "CenteredOrthogonal"
    # B is put through the same steps: the form of B alone equals B put in A's form
    module_b, _ = create_model("gpt2", seed=1, **TINY_GPT2)
    b = held_model(module_b)
    alone = plan_alignment(b, symmetry="orthogonal").form.a
    for key, value in plan.form.with_b(b.params).b.items():
        torch.testing.assert_close(value, alone[key], rtol=0, atol=0, msg=key)
    assert plan_alignment(gpt2, circuits=False).steps == ()


def test_the_plan_is_immutable_and_says_what_it_will_write(gpt2) -> None:
    plan = plan_alignment(gpt2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.choice = plan.choice  # type: ignore[misc]
    lines = [str(line) for line in plan.describe()]
    assert lines[0].startswith("form: circuits (") and "circuits=False" in lines[0]
    assert lines[1] == "writes: B aligned as an lmckit checkpoint of GPT2, A as written beside it"
    # chosen on data: the form is said after aligning, the output line stays
    learned = plan_alignment(gpt2, has_data=True)
    assert learned.chosen_on_data and [str(x) for x in learned.describe()] == [lines[1]]


def test_the_start_rule_and_declared_options() -> None:
    weight = aligner_info("weight_matching")
    assert weight.options == ("start", "max_iter") and not weight.needs_data
    assert AlignRequest(has_data=True).checked()[1].start == "best"
    assert AlignRequest().checked()[1].start == "anchored"
    assert AlignRequest(options={"start": "identity"}).checked()[1].start == "identity"
    with pytest.raises(ParameterError, match=r"^start='best' compares .*: give data$"):
        AlignRequest(options={"start": "best"}).checked()
    with pytest.raises(ParameterError, match="weight_matching has no option 'steps'"):
        AlignRequest(options={"steps": 3}).checked()
    config = AlignRequest(method="learned", options={"steps": 7}, has_data=True).checked()[1]
    assert config.steps == 7
    with pytest.raises(ParameterError, match=r"^method='learned' needs training data"):
        AlignRequest(method="learned").checked()


def test_library_errors_name_python_parameters() -> None:
    module, params = create_model("mlp", seed=0, in_features=4, hidden=[5], out_features=3)
    refusals = [
        lambda: merge_pair(module, params, params, t=2.0),
        lambda: merge_pair(module, params, params, fix="repair"),
        lambda: check_heads_request(True, True),
        lambda: check_simplex_request(3, head_bases=True),
        lambda: AlignRequest(symmetry="rotations").checked(),
        lambda: lmckit.align(module, module, method="nope"),
    ]
    said = []
    for refusal in refusals:
        with pytest.raises(ParameterError) as info:
            refusal()
        said.append(str(info.value))
    assert not any("--" in text for text in said), said
    assert said[0] == "t must lie in [0, 1], got 2.0"
    assert said[2] == "head_bases=True aligns bases inside heads; circuits=True leaves none"


def test_the_command_line_translates_them_to_flags(tmp_path) -> None:
    for name, seed in (("a", 0), ("b", 1)):
        module, params = create_model("mlp", seed=seed, in_features=4, hidden=[5], out_features=3)
        lmckit.save(tmp_path / name, module, params)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    cases = [
        (["merge", a, b, "--t", "2", "--out", str(tmp_path / "m")],
         "Error: --t must lie in [0, 1], got 2.0"),
        (["align", a, b, "--circuits", "--head-bases", "--out", str(tmp_path / "o")],
         "Error: --head-bases aligns bases inside heads; --circuits leaves none"),
        (["align", a, b, "--method", "learned", "--out", str(tmp_path / "o")],
         "Error: --method learned needs training data: give --data"),
        (["barrier", a, b, "--simplex", "--head-bases", "--data", "digits"],
         "Error: --head-bases goes with --align weight"),
    ]  # fmt: skip
    for args, message in cases:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and result.output.strip() == message, result.output
    assert not (tmp_path / "m").exists() and not (tmp_path / "o").exists()
