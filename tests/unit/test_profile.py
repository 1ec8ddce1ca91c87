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


class _Avg:
    """One row of key_averages() as a GPU profile has it (the GPU cannot run here; the sums are what is tested)."""

    def __init__(self, key, device_type, self_device_us, count=1, is_user_annotation=False):
        self.key, self.device_type, self.count = key, device_type, count
        self.self_device_time_total, self.self_cpu_time_total = self_device_us, 5.0
        self.is_user_annotation = is_user_annotation


class _Averages(list):
    def table(self, **kwargs):
        return f"table sorted by {kwargs['sort_by']}"


class _Prof:
    def __init__(self, rows):
        self.rows = _Averages(rows)

    def key_averages(self):
        return self.rows


def test_a_gpu_profile_counts_each_kernel_once():
    """The 7B profile of 2026-11-27 counted NCCL twice: the all-gather kernel and its `nccl:_all_gather_base`
    range on the device's timeline; the CPU operator that launched a GEMM carries its device time too."""
    from trainer.learn.profile import summarize

    rows = [
        _Avg("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "DeviceType.CUDA", 2_970_000, 1668),
        _Avg("nccl:_all_gather_base", "DeviceType.CUDA", 2_970_000, 1668, is_user_annotation=True),
        _Avg("nccl:_reduce_scatter_base", "DeviceType.CUDA", 610_000, 128),
        _Avg("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "DeviceType.CUDA",
             610_000, 128),
        _Avg("nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_TNT", "DeviceType.CUDA", 2_000_000, 57),
        _Avg("aten::mm", "DeviceType.CPU", 2_000_000, 57),  # the operator that launched it
    ]
    summary, table = summarize(_Prof(rows), wall=14.5)
    assert summary["clock"] == "device"
    assert summary["by_kind_s"] == pytest.approx({"nccl": 3.58, "gemm": 2.0})
    assert summary["busy_s"] == pytest.approx(5.58) and summary["compute_s"] == pytest.approx(2.0)
    assert [r["name"][:20] for r in summary["top"]] == ["ncclDevKernel_AllGat", "nvjet_sm90_tst_256x1",
                                                        "ncclDevKernel_Reduce"]
    assert table == "table sorted by self_device_time_total"
