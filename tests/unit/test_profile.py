"""trainer.learn.profile: the --profile_step summary (kinds of kernels, the files) on a CPU rank."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from trainer.learn.profile import StepProfiler, kind_of, render

# kernel names as torch.profiler reports them on H100/H200 runs (and the CPU operators on a CPU rank)
KERNELS = {
    "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)": "nccl",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)": "nccl",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off": "gemm",
    "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT": "gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(...)": "gemm",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false>>(...)": "attention",
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80": "attention",
    "Memcpy DtoH (Device -> Pinned)": "copy",
    "Memset (Device)": "copy",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>": "optimizer",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(...)": "other",
    "aten::mm": "gemm",
    "aten::addmm": "gemm",
    "aten::_softmax": "other",
    "aten::copy_": "copy",
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernels_are_sorted_into_their_kind(name):
    assert kind_of(name) == KERNELS[name]


def _work():
    a = torch.randn(256, 256, requires_grad=True)
    for _ in range(5):
        loss = torch.nn.functional.softmax(a @ a, dim=-1).sum()
        loss.backward()


def test_a_window_of_work_is_summarised_and_written(tmp_path):
    prof = StepProfiler()
    prof.begin(str(tmp_path / "p" / "policy_step2"), trace=True)
    assert prof.active
    _work()
    summary = prof.end()
    assert not prof.active
    assert summary["clock"] == "cpu" and summary["wall_s"] > 0
    assert summary["by_kind_s"]["gemm"] > 0, summary["by_kind_s"]
    assert 0 < summary["compute_s"] <= summary["busy_s"] + 1e-9
    assert summary["top"] == sorted(summary["top"], key=lambda r: -r["s"])
    assert any(r["name"] == "aten::mm" and r["calls"] >= 10 for r in summary["top"]), summary["top"]
    assert json.loads((tmp_path / "p" / "policy_step2.json").read_text())["wall_s"] == summary["wall_s"]
    text = (tmp_path / "p" / "policy_step2.txt").read_text()
    assert text.startswith(render(summary)) and "aten::mm" in text
    with gzip.open(tmp_path / "p" / "policy_step2.trace.json.gz", "rt") as f:
        assert "aten::mm" in f.read()
    assert not (tmp_path / "p" / "policy_step2.trace.json").exists()


def test_no_trace_unless_asked_and_end_without_begin_is_empty(tmp_path):
    prof = StepProfiler()
    assert prof.end() == {}
    prof.begin(str(tmp_path / "x"))
    _work()
    prof.end()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "x.txt"]


def test_a_second_begin_is_refused_while_one_runs(tmp_path):
    prof = StepProfiler()
    prof.begin(str(tmp_path / "a"))
    try:
        with pytest.raises(RuntimeError, match="already running"):
            prof.begin(str(tmp_path / "b"))
    finally:
        prof.end()
