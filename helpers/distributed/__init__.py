"""Lectures 2-4: processes and collectives, data parallelism, memory-efficient training, model parallelism.

Public face of ``helpers.distributed``; names load on first use (torch.distributed only then).
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".comm_models": ["comm_costs", "critical_path_bytes", "rounds", "within"],
    ".concurrency": ["dataloader_demo", "gil_demo", "shared_memory_demo", "start_costs"],
    ".experiments": ["KIB", "MIB", "all_reduce_sweep", "calibrate_link", "traffic_check"],
    ".collectives": ["all_reduce_calls", "collective_calls", "count_traffic", "point_to_point_only", "sends_scaled"],
    ".ddp": ["accumulation_demo", "bucket_sweep", "mlp", "scaling"],
    ".alexnet_parallel": ["alexnet_model_parallel", "tower_forward"],
    ".memsave": ["accumulation_memory", "checkpointing_memory", "demo_transformer",
                 "example_batch", "mean_square_loss", "precision_memory"],
    ".offload": ["OffloadedAdam", "offload_memory"],
    ".recompute": ["recompute_cost"],
    ".pipeline_parallel": ["bubble_fraction", "pipeline_experiment", "pipeline_schedule"],
    ".tensor_parallel": ["copy_to_parallel", "exchange", "gather_from_parallel", "reduce_from_parallel", "scatter_to_parallel",
                         "tensor_parallel_check"],
    ".zero": ["zero_check", "zero_memory"],
    ".sharding": ["dataset_styles", "sharding_check"],
    ".elastic": ["elastic_demo", "processes_of", "run_elastic", "torchrun_command"],
    "helpers.distributed": ["ddp_train", "elastic_train"],
})
