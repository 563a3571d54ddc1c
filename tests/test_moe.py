"""Mixture-of-experts, expert and context parallelism, fp8: counts, costs and invariants."""
import dataclasses as dc
import json

import numpy as np
import pytest

from comet_dse.answers.estimate import estimate
from comet_dse.base.errors import InputError
from comet_dse.cli import main
from comet_dse.cost.step import evaluate
from comet_dse.design_space.space import SearchSpace, enumerate_strategies
from comet_dse.model.load import transformer_from_hf_config
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.strategy.arrays import StrategyArrays
from comet_dse.strategy.choices import Recompute
from comet_dse.strategy.declared import Strategy

H100 = load_cluster("dgx-h100")


@pytest.mark.parametrize("name,total,active", [
    ("mixtral-8x7b", 46.7e9, 12.9e9),     # Jiang et al. 2024, Sec. 1 and 2.1
])
def test_moe_parameter_counts(name, total, active):
    m = load_model(name)
    assert m.total_params() == pytest.approx(total, rel=0.01)
    assert m.active_params() == pytest.approx(active, rel=0.01)


def test_deepseek_v3_parameter_counts():
    m = load_model("deepseek-v3")
    # By hand from the released configuration (MLA, 3 dense + 58 MoE layers, 256 routed + 1 shared).
    attn = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168 + 1536 + 512
    expert = 3 * 7168 * 2048
    moe_layer = attn + 7168 * 256 + 257 * expert + 2 * 7168
    dense_layer = attn + 3 * 7168 * 18432 + 2 * 7168
    embeddings = 2 * 129280 * 7168 + 7168
    assert m.total_params() == 3 * dense_layer + 58 * moe_layer + embeddings
    assert m.total_params() == pytest.approx(671e9, rel=0.01)            # arXiv:2412.19437: 671B total
    active = 3 * dense_layer + 58 * (moe_layer - 248 * expert) + embeddings
    assert m.active_params() == active
    # The report rounds to "37B activated"; the exact count is 37.55B (36.6B without the input embedding).
    assert m.active_params() == pytest.approx(37e9, rel=0.02)


def _write(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


LLAMA_KEYS = {"hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": False}


def test_hf_mixtral_config(tmp_path):
    config = {**LLAMA_KEYS, "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
              "num_local_experts": 8, "num_experts_per_tok": 2}
    m = transformer_from_hf_config(_write(tmp_path, config))
    assert (m.moe.experts, m.moe.top_k, m.moe.ffn) == (8, 2, 14336)
    assert m.total_params() == load_model("mixtral-8x7b").total_params()


def test_hf_qwen_moe_config(tmp_path):
    config = {**LLAMA_KEYS, "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
              "num_key_value_heads": 16, "intermediate_size": 5632, "vocab_size": 151936, "num_experts": 60,
              "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}
    m = transformer_from_hf_config(_write(tmp_path, config))
    assert (m.moe.experts, m.moe.top_k, m.moe.ffn, m.moe.shared_ffn) == (60, 4, 1408, 5632)
    assert m.total_params() == pytest.approx(14.3e9, rel=0.02)   # Qwen1.5-MoE-A2.7B: 14.3B total
    assert m.active_params() == pytest.approx(2.7e9, rel=0.05)   # 2.7B activated


def test_hf_deepseek_config_and_missing_key(tmp_path):
    config = {**LLAMA_KEYS, "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
              "num_key_value_heads": 128, "intermediate_size": 18432, "vocab_size": 129280,
              "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
              "n_shared_experts": 1, "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
              "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "n_group": 8, "topk_group": 4}
    m = transformer_from_hf_config(_write(tmp_path, config))
    assert m.total_params() == load_model("deepseek-v3").total_params()
    assert (m.moe.expert_groups, m.moe.groups_per_token) == (8, 4)
    del config["moe_intermediate_size"]
    with pytest.raises(InputError, match="moe_intermediate_size"):
        transformer_from_hf_config(_write(tmp_path, config))


def _mixtral_strategies(eps):
    return StrategyArrays.of([Strategy(tp=2, pp=2, dp=16, ep=e, global_batch=128, recompute=Recompute.FULL,
                                       sequence_parallel=True, flash_attention=True) for e in eps])


def test_more_experts_per_device_never_reduces_memory():
    model = load_model("mixtral-8x7b").with_seq_len(4096)
    mem = evaluate(model, H100, 64, _mixtral_strategies([1, 2, 4, 8])).memory_total
    assert np.all(np.diff(mem) < 0)        # ep up = fewer experts per device = less memory


def test_expert_all_to_all_appears_and_faster_network_helps():
    model = load_model("mixtral-8x7b").with_seq_len(4096)
    st = Strategy(tp=2, pp=2, dp=16, ep=8, global_batch=128, recompute=Recompute.FULL, sequence_parallel=True,
                  flash_attention=True)
    base = estimate(model, H100, 64, st)
    assert base.breakdown_s["ep_communication"] > 0
    fast = dc.replace(H100, network=tuple(dc.replace(d, link_bandwidth=2 * d.link_bandwidth) for d in H100.network))
    faster = estimate(model, fast, 64, st)
    assert faster.breakdown_s["ep_communication"] < base.breakdown_s["ep_communication"]
    assert faster.step_time_s <= base.step_time_s
    hidden = estimate(model, H100, 64, dc.replace(st, ep_overlap=True))
    assert hidden.breakdown_s["ep_communication"] < base.breakdown_s["ep_communication"]
    imbalanced = estimate(model, H100, 64, dc.replace(st, moe_imbalance=1.5))
    assert imbalanced.step_time_s > base.step_time_s


def test_mfu_counts_activated_flops():
    model = load_model("mixtral-8x7b").with_seq_len(4096)
    r = estimate(model, H100, 64, Strategy(tp=2, pp=2, dp=16, ep=8, global_batch=128, recompute=Recompute.NONE,
                                           sequence_parallel=True, flash_attention=True))
    tokens = 128 * 4096
    # 6 * active matmul parameters per token dominate; total parameters would be 3.6x more.
    assert r.model_flops_per_step == pytest.approx(6 * tokens * model.active_params(), rel=0.15)


def test_context_parallelism_for_long_sequences():
    model = load_model("llama3-8b").with_seq_len(131072)
    base = Strategy(tp=8, pp=1, dp=1, cp=16, global_batch=8, micro_batch=1, recompute=Recompute.SELECTIVE,
                    sequence_parallel=True, flash_attention=True)
    r = estimate(model, H100, 128, base)
    assert r.feasible, r.reasons
    # the ring's K/V passes hide (almost) behind 8K-query attention; on 100x slower links they no longer do
    assert r.breakdown_s["cp_communication"] < 0.01 * r.step_time_s
    slow = dc.replace(H100, network=tuple(dc.replace(d, link_bandwidth=d.link_bandwidth / 100) for d in H100.network))
    assert estimate(model, slow, 128, base).breakdown_s["cp_communication"] > 0.1 * r.step_time_s
    fewer = estimate(model, H100, 64, dc.replace(base, cp=8))
    assert r.memory_bytes["activations"] < fewer.memory_bytes["activations"]
    assert estimate(model, H100, 8, dc.replace(base, cp=1)).feasible is False   # 128K tokens on 8 GPUs: too big


def test_fp8_speeds_up_gemms_and_costs_a_weight_copy():
    model = load_model("llama3-70b")
    st = Strategy(tp=8, pp=4, dp=8, global_batch=256, recompute=Recompute.SELECTIVE, sequence_parallel=True,
                  flash_attention=True)
    bf16 = estimate(model, H100, 256, st)
    fp8 = estimate(model, H100, 256, dc.replace(st, dtype="fp8"))
    assert fp8.breakdown_s["compute"] < bf16.breakdown_s["compute"]
    assert fp8.memory_bytes["weights"] > bf16.memory_bytes["weights"]
    with pytest.raises(InputError, match="no fp8 rate"):
        estimate(model, load_cluster("dgx-a100-80gb"), 256, dc.replace(st, dtype="fp8"))


def test_search_space_includes_expert_degrees():
    model = load_model("mixtral-8x7b")
    st = enumerate_strategies(model, 64, 256, SearchSpace.of(recompute=("full",), zero=(1,)))
    assert set(np.unique(st.ep)) == {1, 2, 4, 8}
    assert np.all(st.dp % st.ep == 0)
    long = load_model("llama3-8b").with_seq_len(65536)
    assert 16 in set(enumerate_strategies(long, 64, 64, SearchSpace.of(recompute=("full",))).cp)


@pytest.mark.parametrize("argv,needle", [
    (["--model", "mixtral-8x7b", "--ep", "3", "--dp", "24", "--devices", "24"], "ep: ep=3 must divide the 8 experts and dp=24"),
    (["--model", "llama3-8b", "--ep", "2", "--dp", "8", "--devices", "8"], "ep: ep=2 needs a mixture-of-experts model"),
    (["--model", "llama3-8b", "--cp", "3", "--dp", "1", "--devices", "3"], "cp: cp=3 does not divide the sequence length 8192"),
])
def test_bad_ep_cp_is_one_line_exit_2(capsys, argv, needle):
    code = main(["estimate", "--cluster", "dgx-h100", "--global-batch", "24", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
