"""A module that does not trace: one line naming the module and the line of code that
stopped it, and saying when the model does not run on the inputs at all."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from click.testing import CliRunner
from torch import Tensor, nn

from lmckit.cli import main
from lmckit.inference import SpecInferenceError, infer_spec


class Branch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x)
        if h.sum() > 0:  # a branch on the data: export cannot follow it
            h = h * 2
        return h


class Wrong(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.view(-1, 5)  # 3 x 4 features do not split into rows of 5


class Model(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.embed, self.block, self.out = nn.Linear(2, 4), inner, nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.block(self.embed(x)))


def test_a_module_that_does_not_trace_is_named_with_its_line() -> None:
    with pytest.raises(SpecInferenceError) as err:
        infer_spec(Model(Branch()), torch.randn(3, 2))
    line = str(err.value)
    assert "\n" not in line
    assert "module 'block' (Branch)" in line and "(if h.sum() > 0:" in line
    assert "test_trace_failure.py:" in line and "does not run" not in line


def test_a_model_that_does_not_run_on_the_inputs_says_so() -> None:
    with pytest.raises(SpecInferenceError) as err:
        infer_spec(Model(Wrong()), torch.randn(3, 2))
    line = str(err.value)
    assert "\n" not in line
    assert "Model does not run on these inputs in module 'block' (Wrong)" in line
    assert "return x.view(-1, 5)" in line and "fails without tracing too" in line


def test_deepseek_with_more_expert_groups_than_experts_is_refused_naming_its_router(
    tmp_path: Path,
) -> None:
    # n_group defaults to 8: four experts cannot be cut into eight groups, so the model
    # does not run at all (what looked like a model export cannot trace)
    config = transformers.DeepseekV3Config(
        vocab_size=61, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.DeepseekV3ForCausalLM(config).save_pretrained(tmp_path / "m")
    result = CliRunner().invoke(main, ["symmetries", str(tmp_path / "m")])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: ")
    assert "module 'model.layers.1.mlp.gate' (DeepseekV3TopkRouter)" in line
    assert "does not run on these inputs" in line
