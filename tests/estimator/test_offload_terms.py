"""CPU offload terms against bytes computed by hand from DeepSpeed 0.19.8 / torch 2.13 FSDP2 allocation sites."""

from estimator.terms import offload as off

GIB = 2**30


def test_deepspeed_zero2_optimizer_offload_host_bytes_by_hand():
    # 1.5B trainable on 4 ranks: 375M each; fp32 master 1.5e9 B, Adam 3e9 B, fp32 grads 1.5e9 B, bf16 copy 0.75e9 B
    host = off.ds_host_per_rank(1_500_000_000, 1_500_000_000, 4, 2, off.Offload(optimizer=True), 10)
    assert host == {
        "master_weights": 1_500_000_000,
        "optimizer_state": 3_000_000_000,
        "gradients": 1_500_000_000,
        "bit16_partition": 750_000_000,
        "grad_staging": 20,
    }
    assert off.host_ram_node(host, 4) == 4 * 6_750_000_020


def test_zero3_param_offload_adds_the_bf16_partition_and_stage2_ignores_it():
    z3 = off.ds_host_per_rank(8, 10, 4, 3, off.Offload(optimizer=False, param=True), 1)
    assert z3 == {"weights": 2 * 3}  # ceil(10 / 4) = 3 elements of 2 bytes
    assert off.ds_host_per_rank(8, 10, 4, 2, off.Offload(param=True), 1) == {}
    assert "weights" in off.ds_gpu_moved(3, off.Offload(param=True))
    assert "weights" not in off.ds_gpu_moved(2, off.Offload(optimizer=True, param=True))


def test_fsdp_offload_host_and_pinned():
    host = off.fsdp_host_per_rank(shard_numel=100, shard_bytes=4)
    assert host == {"weights": 400, "gradients": 400, "optimizer_state": 800}
    assert off.pinned_bytes(host, off.Offload(param=True)) == 800
    assert off.pinned_bytes(host, off.Offload(param=True, pin_memory=False)) == 0


def test_model_load_every_rank_or_only_rank0():
    assert off.model_load_host(7_000_000_000, 2, 8, efficient_loading=False) == 112_000_000_000
    assert off.model_load_host(7_000_000_000, 2, 8, efficient_loading=True) == 14_000_000_000


def test_host_ram_check_says_how_short():
    assert off.check_host_ram(10 * GIB, 16) is None
    msg = off.check_host_ram(20 * GIB, 16)
    assert msg is not None and "4.0 GiB short" in msg and "\n" not in msg


def test_zero2_optimizer_offload_leaves_the_gpu_and_lands_on_the_host():
    from estimator.model.catalog import resolve_model
    from estimator.settings.config import RunConfig
    from estimator.step.estimate import estimate
    from estimator.step.offload import host_ram

    cfg = RunConfig(model="1.5B", dtype="bfloat16", num_gpus=4, sharding="zero2")
    on_gpu = estimate(cfg)
    off_gpu = estimate(cfg.with_(offload_optimizer=True))
    arch = resolve_model("1.5B")
    arch = arch[0] if isinstance(arch, tuple) else arch
    vh = (
        151936 * 1536
    )  # Qwen2.5-1.5B's embedding, its largest parameter (config.json: vocab_size, hidden_size)
    for phase, comps in off_gpu.phases.items():
        assert not {"optimizer_state", "master_weights", "gradients"} & set(comps), phase
        assert comps["offload_staging"] == 2 * vh  # one bf16 staging buffer of the largest parameter
    assert off_gpu.peak_allocated_bytes < on_gpu.peak_allocated_bytes
    t = arch.total_params  # all trainable (full fine-tuning)
    share = -(-t // 4)
    # pinned, each in its power-of-two block (torch's CachingHostAllocator): fp32 master and gradient partitions
    # (1.54e9 B -> 2**31 each), the bf16 copy (0.77e9 B -> 2**30), the staging twin (0.47e9 B -> 2**29); AdamW's
    # m and v unpinned (8 bytes an element)
    assert 2**30 < 4 * share <= 2**31 and 2**29 < 2 * share <= 2**30 and 2**28 < 2 * vh <= 2**29
    per_rank = 2 * 2**31 + 2**30 + 2**29 + 8 * share
    # and each of the 4 processes' own memory (measured, 3541 MiB)
    assert host_ram(cfg.with_(offload_optimizer=True), arch)["training"] == 4 * (per_rank + 3541 * 2**20)


def test_offload_flag_combinations_refused_in_one_line():
    from estimator.settings.config import RunConfig
    from estimator.settings.validate import offload_problem

    assert "--zero 2|3 or --fsdp" in offload_problem(RunConfig(offload_optimizer=True))
    assert "ZeRO-3" in offload_problem(RunConfig(num_gpus=2, sharding="zero2", offload_param=True))
    assert "--offload-param" in offload_problem(
        RunConfig(num_gpus=2, sharding="fsdp", offload_optimizer=True)
    )
    assert offload_problem(RunConfig(num_gpus=2, sharding="zero3", offload_param=True)) is None


def test_zero3_param_offload_gathers_every_weight_onto_the_gpu_for_generation():
    """TRL's generation under ZeRO-3 (ds3_gather_for_generation=True) wraps `GatheredParameters(model.parameters())`:
    with offload_param no shard stays on the GPU, so the whole bf16 policy is gathered there, on one GPU too."""
    from estimator.settings.config import RunConfig
    from estimator.step.estimate import estimate

    params = (
        1_543_714_304  # Qwen2.5-1.5B-Instruct: safetensors index total_size 3,087,428,608 bytes / 2 (bf16)
    )
    for gpus in (1, 4):
        cfg = RunConfig(
            model="1.5B",
            dtype="bfloat16",
            num_gpus=gpus,
            sharding="zero3",
            offload_optimizer=True,
            offload_param=True,
        )
        gen = estimate(cfg).phases["generate"]
        assert "weights" not in gen  # the partition lives on the host
        assert gen["gathered_weights"] == 2 * params
    # without offload, one GPU already holds all of it: nothing to gather
    one = RunConfig(model="1.5B", dtype="bfloat16", num_gpus=1, sharding="zero3")
    assert "gathered_weights" not in estimate(one).phases["generate"]
    # over 4 GPUs the all-gather fills a full-size buffer beside the rank's own quarter (DeepSpeed's flat_tensor
    # and ds_tensor): the whole policy again, the shard still counted under weights
    four = estimate(RunConfig(model="1.5B", dtype="bfloat16", num_gpus=4, sharding="zero3")).phases[
        "generate"
    ]
    assert four["gathered_weights"] == 2 * params
    assert four["weights"] == 2 * -(-params // 4)


def test_pinned_buffers_take_power_of_two_blocks():
    # torch's CachingHostAllocator: PowerOf2Ceil of each pinned request; a 1.5437e9-element fp32 partition
    # (6,174,857,216 B) takes 2**33 B
    assert off.pinned_block(6_174_857_216) == 2**33
    assert (
        off.pinned_block(2**30) == 2**30 and off.pinned_block(2**30 + 1) == 2**31 and off.pinned_block(0) == 0
    )
    host = {"master_weights": 6_174_857_216, "optimizer_state": 12_349_714_432}
    assert off.ds_host_blocks(host, off.Offload(optimizer=True)) == {
        "master_weights": 2**33,
        "optimizer_state": 12_349_714_432,
    }
    assert off.ds_host_blocks(host, off.Offload(optimizer=True, pin_memory=False)) == host


def test_zero3_host_blocks_by_hand():
    # ZeRO-3, 1.5e9 trainable on one rank, optimizer and parameter offload: fp32 master (6e9 B) and AdamW's state
    # unpinned; fp32 gradients pinned per 1e9-element sub-group (4e9 -> 2**32, 2e9 -> 2**31); the bf16 gradient
    # partitions (3e9 -> 2**32) and the flat bf16 parameters (3e9 -> 2**32); two parameters' own partitions
    # (3 MB -> 2**22 each)
    t = 1_500_000_000
    per = off.ds_host_per_rank(t, t, 1, 3, off.Offload(optimizer=True, param=True), 10)
    got = off.ds_host_blocks(per, off.Offload(optimizer=True, param=True), 3, (3_000_000, 3_000_000))
    assert got == {
        "master_weights": 6_000_000_000,
        "optimizer_state": 12_000_000_000,
        "gradients": 2**32 + 2**31,
        "bit16_partition": 0,
        "bit16_gradients": 2**32,
        "weights": 2**32,
        "weight_partitions": 2 * 2**22,
    }
    assert off.sub_groups(2_500_000_000) == [10**9, 10**9, 5 * 10**8]
