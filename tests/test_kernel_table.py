"""Kernel classes: the name rules against real kernel names (as cuBLAS, cuDNN, CUTLASS, PyTorch, Triton and NCCL name
them in profiles), and the classifier on a real profiler run and a real oneDNN log of this machine."""
from __future__ import annotations

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent

from helpers.training import classify_kernel, cnn_training_step, kernels_by_class
from helpers.training.kernel_table import (
    COMMUNICATION,
    COPIES,
    CPU_ATEN,
    CPU_CLASSES,
    CPU_CONV,
    CPU_FRAMEWORK,
    CPU_GEMM,
    CPU_MEMORY,
    CPU_SLOW_CONV,
    ELEMENTWISE,
    GPU_CLASSES,
    PLAIN_MATMUL,
    TENSOR_CORE,
    gpu_kernel_times,
    parse_onednn_log,
)
from helpers.training.profiling import op_costs

GPU_NAMES = [
    ("volta_h884gemm_128x128_ldg8_nn", TENSOR_CORE),
    ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn", TENSOR_CORE),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_tn", TENSOR_CORE),
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn", TENSOR_CORE),
    ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", TENSOR_CORE),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_tn_align8::Params)", TENSOR_CORE),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", TENSOR_CORE),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", TENSOR_CORE),
    ("nvjet_tst_128x8_64x12_2x1_v_bz_splitK_TNT", TENSOR_CORE),
    ("nvjet_sm90_tst_168x128_64x5_1x2_h_bz_TNN", TENSOR_CORE),  # cuBLAS 13 (torch's cu130 wheels) names the architecture first
    ("nvjet_sm90_sss_128x64_64x8_1x2_h_bz_TNN", PLAIN_MATMUL),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, "
     "Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, false, false, false, true, true, false>(Flash_fwd_params)", TENSOR_CORE),
    ("ampere_sgemm_128x64_nn", PLAIN_MATMUL),
    ("volta_sgemm_128x64_tn", PLAIN_MATMUL),
    ("cutlass_80_simt_sgemm_128x128_8x4_nn_align1", PLAIN_MATMUL),
    ("volta_scudnn_128x64_relu_interior_nn_v1", PLAIN_MATMUL),
    ("void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)", PLAIN_MATMUL),
    ("void cudnn::detail::wgrad_alg0_engine<float, 128, 6, 8, 3, 3, 5, false, 512>(int, int, int, float const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)", PLAIN_MATMUL),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, cublasGemvParamsEx<int, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >"
     "(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float>, float>, float, float)", PLAIN_MATMUL),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", ELEMENTWISE),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)", ELEMENTWISE),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", ELEMENTWISE),
    ("triton_poi_fused_add_mul_tanh_0", ELEMENTWISE),
    ("triton_red_fused__log_softmax_0", ELEMENTWISE),
    ("Memcpy HtoD (Pageable -> Device)", COPIES),
    ("Memset (Device)", COPIES),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1})", COPIES),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)0>(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)", COPIES),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", COMMUNICATION),
]

CPU_NAMES = [
    ("aten::addmm", CPU_GEMM), ("aten::mm", CPU_GEMM), ("aten::bmm", CPU_GEMM),
    ("aten::mkldnn_convolution", CPU_CONV), ("aten::convolution_backward", CPU_CONV), ("aten::_slow_conv2d_forward", CPU_SLOW_CONV),
    ("aten::_slow_conv2d_backward", CPU_SLOW_CONV),  # ATen's own loops: no oneDNN primitive runs
    ("aten::_convert_indices_from_coo_to_csr", CPU_ATEN),  # 'conv' in 'convert' is no convolution
    ("convolution jit:avx512_core (forward_training)", CPU_CONV),
    ("convolution brgconv:avx512_core_amx (forward_inference)", CPU_CONV),
    ("matmul brg_matmul:avx512_core_bf16 (undef)", CPU_GEMM),
    ("inner_product brgemm:avx512_core_amx (forward_training)", CPU_GEMM),
    ("reorder jit:uni (undef)", CPU_MEMORY), ("aten::copy_", CPU_MEMORY), ("aten::empty_strided", CPU_MEMORY),
    ("aten::relu", CPU_ATEN), ("aten::_log_softmax", CPU_ATEN), ("eltwise jit:avx512_core (forward_training)", CPU_ATEN),
    ("Optimizer.step#SGD.step", CPU_FRAMEWORK), ("autograd::engine::evaluate_function: AddmmBackward0", CPU_FRAMEWORK),
]


@pytest.mark.parametrize("name, expected", GPU_NAMES)
def test_gpu_kernel_names_fall_in_their_class(name, expected):
    assert classify_kernel(name, "cuda") == expected


@pytest.mark.parametrize("name, expected", CPU_NAMES)
def test_cpu_op_and_onednn_names_fall_in_their_class(name, expected):
    assert classify_kernel(name, "cpu") == expected


def test_onednn_log_lines_are_parsed_and_other_lines_skipped():
    log = "\n".join([
        "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost and bfloat16 support",
        "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,src:f32:a:blocked:abcd::f0 "
        "dst:f32:a:blocked:aBcd16b::f0,attr-scratchpad:user,alg:convolution_direct,mb8_ic3oc16_ih32oh30kh3sh1dh0ph0_iw32ow30kw3sw1dw0pw0,25.3",
        "some other program's output",
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 dst:f32::blocked:Acdb16a::f0,attr-scratchpad:user,,16x3x3x3,0.0031",
    ])
    assert parse_onednn_log(log) == [("convolution", "jit:avx512_core", "forward_training", 25.3), ("reorder", "jit:uni", "undef", 0.0031)]


def test_a_real_cpu_step_is_classified_from_its_profile_and_onednn_log():
    threads_before = torch.get_num_threads()
    report = kernels_by_class(cnn_training_step("cpu", batch=4, channels=8, image=16), steps=3, device="cpu", label="test step", threads=1)
    assert torch.get_num_threads() == threads_before and "on cpu, 1 CPU thread" in report.notes[0]
    assert [r.kernel_class for r in report.rows] == list(CPU_CLASSES)
    assert sum(r.share for r in report.rows) == pytest.approx(1.0)
    assert report.find(kernel_class=CPU_CONV).share > 0 and report.find(kernel_class=CPU_GEMM).calls > 0
    assert report.kernels.find(name="aten::mkldnn_convolution").kernel_class == CPU_CONV
    times = [k.seconds for k in report.kernels.rows]
    assert times == sorted(times, reverse=True)
    # every op the profiler saw is in exactly one class: the counts add up
    assert sum(r.kernels for r in report.rows) == int(report.kernels.notes[0].split()[0])
    if torch.backends.mkldnn.is_available():
        classes = {k.kernel_class for k in report.onednn.rows if k.name.startswith("convolution ")}
        assert classes == {CPU_CONV}
    assert "oneDNN primitives that ran" in report.table()
    assert len(report.step_seconds) == 3 and "kernel_table.step" not in {k.name for k in report.kernels.rows}
    assert "x the time of" in report.compare_steps(report)


def test_gpu_classes_and_bad_dtype():
    assert len(set(GPU_CLASSES)) == len(GPU_CLASSES) and classify_kernel("some_custom_kernel", "cuda") in GPU_CLASSES
    with pytest.raises(ValueError, match="'bf16' or 'fp16'"):
        cnn_training_step("cpu", dtype="int8")


def test_the_class_chart_draws_one_bar_per_class_with_time():
    report = kernels_by_class(cnn_training_step("cpu", batch=2, channels=4, image=8), steps=1, device="cpu", onednn=False)
    ax = report.plot()
    assert len(ax.patches) == sum(1 for r in report.rows if r.seconds > 0) and report.onednn is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (7, 0),
                    reason="tensor cores need a GPU of compute capability 7.0 or later")
def test_an_fp16_matmul_on_a_gpu_runs_a_kernel_named_as_a_tensor_core_kernel():
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    report = kernels_by_class(lambda: a @ a, steps=3, device="cuda", label="fp16 matmul")
    assert [r.kernel_class for r in report.rows] == list(GPU_CLASSES)
    assert report.find(kernel_class=TENSOR_CORE).share > 0.5, report.table()


def _gpu_profile():
    """A GPU step's profile as torch.profiler reports it (built from torch's own event classes): two ops with the kernels
    they launched, the kernels again as GPU rows, and the optimizer's record_function range on both sides."""
    def event(i, name, start_us, end_us, device_type=DeviceType.CPU, annotation=False):
        return FunctionEvent(id=i, name=name, thread=0, start_us=start_us, end_us=end_us, use_device="cuda", device_type=device_type,
                             is_user_annotation=annotation, stack=[], input_shapes=[])

    gemm, add = "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT", "vectorized_elementwise_kernel"
    mm, add_op = event(1, "aten::mm", 0, 10), event(2, "aten::add_", 10, 12)
    mm.append_kernel(gemm, 0, 300)
    add_op.append_kernel(add, 0, 100)
    events = EventList([mm, add_op, event(3, "Optimizer.step#SGD.step", 9, 13), event(4, gemm, 20, 320, DeviceType.CUDA),
                        event(5, add, 330, 430, DeviceType.CUDA), event(6, "Optimizer.step#SGD.step", 320, 440, DeviceType.CUDA, True)],
                       use_device="cuda")
    events._build_tree()
    return events.key_averages()


def test_gpu_kernel_time_counts_each_kernel_once_and_no_profiler_range():
    timed = dict((name, seconds) for name, _, seconds in gpu_kernel_times(_gpu_profile()))
    assert timed == {"nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT": pytest.approx(300e-6), "vectorized_elementwise_kernel": pytest.approx(100e-6)}


def test_op_shares_on_a_gpu_are_of_the_kernel_time_and_add_up_to_it():
    costs = {c.op: c for c in op_costs(_gpu_profile(), on_gpu=True)}
    assert set(costs) == {"aten::mm", "aten::add_", "Optimizer.step#SGD.step"}  # ops only: no kernel listed beside its op
    assert costs["aten::mm"].self_share == pytest.approx(0.75) and costs["aten::add_"].self_share == pytest.approx(0.25)
    assert sum(c.self_share for c in costs.values()) == pytest.approx(1.0)
