"""The training loop applies every knob for real: each test checks what actually runs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import autotune
from autotune.config import from_flat
from autotune.errors import ConfigError, UserCodeError, UserError
from autotune.apply import default_threads
from autotune.loop import Trainer
from workloads import check_finite
from workloads import Block, Empty, Images, NormBlock, Vectors, blocks_model, ce_loss, convnet, make, mlp, norm_model  # noqa: F401

CPU = torch.device("cpu")



def cfg(**flat) -> autotune.TrainConfig:
    return from_flat({k.replace("__", "."): v for k, v in flat.items()})


def trainer(workload, seed: int = 0, **flat) -> Trainer:
    return Trainer(workload, cfg(**flat), CPU, seed=seed)


def params(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.model.named_parameters()}


def grads_at_step(t: Trainer) -> list[dict[str, torch.Tensor]]:
    """Record the gradients the optimizer sees at every step."""
    seen: list[dict[str, torch.Tensor]] = []

    def hook(opt, args, kwargs):
        seen.append({k: p.grad.detach().clone() for k, p in t.model.named_parameters()})

    t.optimizer.register_step_pre_hook(hook)
    return seen


# --- memory.micro_batch_size -------------------------------------------------------------


def test_micro_batches_give_the_full_batch_gradients_params_and_losses():
    wl = make()
    sizes: list[int] = []

    def loss(model, batch):
        sizes.append(batch[0].shape[0])
        return ce_loss(model, batch)

    full = trainer(make(loss=loss))
    micro = trainer(make(loss=loss), memory__micro_batch_size=4)
    assert micro.accum == 4 and full.accum == 1
    g_full, g_micro = grads_at_step(full), grads_at_step(micro)
    assert_close(params(full), params(micro))  # same seeded init

    sizes.clear()
    l_full = full.train(3)
    assert sizes == [16] * 3
    sizes.clear()
    l_micro = micro.train(3)
    assert sizes[:3] == [4, 2, 2]  # the one look at how the loss reduces its samples (`autotune.reduction`)
    assert sizes[3:] == [4] * 12, "the global batch must be split into 4 micro-batches per step"
    assert micro.loss_sums is False

    assert_close(l_micro, l_full, rtol=1e-5, atol=1e-5)
    assert len(g_full) == len(g_micro) == 3
    for a, b in zip(g_full, g_micro):
        assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert_close(params(micro), params(full), rtol=1e-5, atol=1e-5)
    assert wl.batch_size == 16  # the global batch is never changed


@pytest.mark.parametrize("model", [mlp, norm_model])
def test_micro_batches_keep_the_gradient_of_a_loss_that_sums_its_samples(model):
    """Each micro-batch's loss was divided by the micro-steps whatever the loss: a loss that
    sums its samples (reduction="sum") trained at a quarter of its gradient with 4 micro-steps,
    a learning rate 4x lower than the untuned run's, and no figure said so. Now the trainer
    looks once and divides only a loss that averages its samples (BatchNorm in the model too:
    its batch statistics differ between a batch and its halves, eval mode has none)."""

    def summed(m, batch):
        return F.cross_entropy(m(batch[0]), batch[1], reduction="sum")

    for loss, sums in ((summed, True), (ce_loss, False)):
        wl = make(model=model, loss=loss)
        full, micro = trainer(wl), trainer(wl, memory__micro_batch_size=4)
        g_full, g_micro = grads_at_step(full), grads_at_step(micro)
        l_full, l_micro = full.train(2), micro.train(2)
        assert micro.loss_sums is sums
        if model is mlp:  # the same gradients, so the same steps (BatchNorm normalises each micro-batch alone)
            assert_close(l_micro, l_full, rtol=1e-5, atol=1e-4)
            assert_close(g_micro, g_full, rtol=1e-4, atol=1e-5)


def test_micro_batches_split_dict_batches_too():
    def collate(samples):
        xs, ys = zip(*samples)
        return {"x": torch.stack(xs), "y": torch.stack(ys), "tag": "kept"}

    def loss(model, batch):
        assert batch["tag"] == "kept"
        return F.cross_entropy(model(batch["x"]), batch["y"])

    wl = make(loss=loss, collate_fn=collate)
    full, micro = trainer(wl), trainer(wl, memory__micro_batch_size=8)
    assert_close(micro.train(2), full.train(2), rtol=1e-5, atol=1e-5)
    assert_close(params(micro), params(full), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("micro", [5, 32])
def test_micro_batch_that_does_not_divide_the_batch_is_a_config_error(micro):
    with pytest.raises(ConfigError) as info:
        trainer(make(), memory__micro_batch_size=micro)
    assert len(info.value.errors) == 1
    assert "memory.micro_batch_size" in info.value.errors[0] and "16" in info.value.errors[0]


# --- CUDA-only knobs on CPU --------------------------------------------------------------


def test_cuda_only_knobs_on_cpu_are_all_listed():
    with pytest.raises(ConfigError) as info:
        trainer(make(), data__pin_memory=True, precision__tf32=True, backend__cudnn_benchmark=True)
    errs = info.value.errors
    assert len(errs) == 3, errs
    for key in ("data.pin_memory", "precision.tf32", "backend.cudnn_benchmark"):
        assert any(key in e and "CUDA" in e for e in errs), (key, errs)


def test_all_applicability_errors_come_together():
    wl = make(model=blocks_model)  # no checkpoint_blocks declared
    with pytest.raises(ConfigError) as info:
        trainer(wl, memory__micro_batch_size=3, memory__activation_checkpointing=True, data__pin_memory=True)
    assert len(info.value.errors) == 3, info.value.errors


# --- layout.channels_last ----------------------------------------------------------------


def test_channels_last_converts_conv_weights_and_inputs():
    seen: list[bool] = []

    def loss(model, batch):
        seen.append(batch[0].is_contiguous(memory_format=torch.channels_last))
        return F.cross_entropy(model(batch[0]), batch[1])

    wl = make(model=convnet, dataset=lambda: Images(32), loss=loss, batch_size=8)
    plain = trainer(wl)
    assert plain.has_conv
    assert not plain.model[0].weight.is_contiguous(memory_format=torch.channels_last)
    plain.train(1)
    assert seen == [False]

    seen.clear()
    cl = trainer(wl, layout__channels_last=True)
    assert cl.model[0].weight.is_contiguous(memory_format=torch.channels_last)
    losses = cl.train(2)
    assert seen == [True, True]
    assert check_finite(losses)
    # the parameters stay channels_last after optimizer steps
    assert cl.model[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_has_conv_is_found_by_looking_at_the_model():
    assert trainer(make(model=convnet, dataset=lambda: Images(32), batch_size=8)).has_conv
    assert not trainer(make()).has_conv


# --- memory.activation_checkpointing -----------------------------------------------------


def test_activation_checkpointing_without_blocks_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        trainer(make(model=blocks_model), memory__activation_checkpointing=True)
    assert len(info.value.errors) == 1 and "checkpoint_blocks" in info.value.errors[0]


def test_activation_checkpointing_wraps_the_blocks_and_keeps_the_loss():
    wl = make(model=blocks_model, checkpoint_blocks=(Block,))
    plain = trainer(wl)
    ckpt = trainer(wl, memory__activation_checkpointing=True)
    l_plain, l_ckpt = plain.train(2), ckpt.train(2)
    assert_close(l_ckpt, l_plain, rtol=1e-6, atol=1e-6)
    assert_close(params(ckpt), params(plain), rtol=1e-6, atol=1e-6)

    blocks_plain = [m for m in plain.model.modules() if isinstance(m, Block)]
    blocks_ckpt = [m for m in ckpt.model.modules() if isinstance(m, Block)]
    assert len(blocks_ckpt) == 2
    assert [b.calls for b in blocks_plain] == [2, 2]  # once per step
    assert [b.calls for b in blocks_ckpt] == [4, 4]  # forward + recompute in backward

    # without grad (evaluation) the wrapped block runs once, no checkpoint
    with torch.no_grad():
        ckpt.model(torch.randn(2, 8))
    assert [b.calls for b in blocks_ckpt] == [5, 5]


def test_activation_checkpointing_updates_batchnorm_statistics_once_a_step():
    """The recomputation in backward runs a block's forward again: its BatchNorm updated its
    running statistics twice a step (num_batches_tracked 2 after one step), so the tuned
    run's model differed from the untuned one's. They match now, and so do the weights."""
    wl = make(model=norm_model, checkpoint_blocks=(NormBlock,))
    plain = trainer(wl)
    ckpt = trainer(wl, memory__activation_checkpointing=True)
    assert_close(ckpt.train(3), plain.train(3), rtol=1e-6, atol=1e-6)
    assert_close(params(ckpt), params(plain), rtol=1e-6, atol=1e-6)
    stats = [(k, b) for k, b in ckpt.model.named_buffers()]
    assert len(stats) == 6 and dict(stats)["1.norm.num_batches_tracked"].item() == 3
    for (k, b), (_, a) in zip(stats, plain.model.named_buffers()):
        assert_close(b, a, rtol=1e-6, atol=1e-6, msg=k)


# --- precision.amp -----------------------------------------------------------------------


@pytest.mark.parametrize("amp,dtype", [("none", torch.float32), ("bf16", torch.bfloat16)])
def test_amp_sets_the_forward_dtype(amp, dtype):
    dtypes: list[torch.dtype] = []

    def loss(model, batch):
        out = model(batch[0])
        dtypes.append(out.dtype)
        return F.cross_entropy(out.float(), batch[1])

    t = trainer(make(loss=loss), precision__amp=amp)
    assert t.scaler is None
    losses = t.train(2)
    assert dtypes == [dtype, dtype]
    assert check_finite(losses)
    assert all(p.dtype == torch.float32 for p in t.model.parameters())  # master weights stay fp32


def test_amp_fp16_adds_a_grad_scaler():
    dtypes: list[torch.dtype] = []

    def loss(model, batch):
        out = model(batch[0])
        dtypes.append(out.dtype)
        return F.cross_entropy(out.float(), batch[1])

    t = trainer(make(loss=loss), precision__amp="fp16")
    assert isinstance(t.scaler, torch.amp.GradScaler)
    assert check_finite(t.train(2))
    assert dtypes == [torch.float16, torch.float16]


# --- optimizer.impl ----------------------------------------------------------------------


def test_optimizer_impl_default_keeps_the_users_optimizer():
    made = []

    def opt(params):
        made.append(torch.optim.SGD(params, lr=0.1))
        return made[-1]

    t = trainer(make(optimizer=opt))
    assert t.optimizer is made[0]


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_impl_rebuilds_with_the_flag(impl):
    def opt(params):
        params = list(params)
        return torch.optim.SGD([{"params": params[:2], "lr": 0.05}, {"params": params[2:]}], lr=0.1, momentum=0.9)

    t = trainer(make(optimizer=opt), optimizer__impl=impl)
    other = "fused" if impl == "foreach" else "foreach"
    assert isinstance(t.optimizer, torch.optim.SGD)
    assert len(t.optimizer.param_groups) == 2
    for g in t.optimizer.param_groups:
        assert g[impl] is True
        assert not g[other]
        assert g["momentum"] == 0.9
    assert [g["lr"] for g in t.optimizer.param_groups] == [0.05, 0.1]
    # it optimises the model's own parameters
    ids = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert ids == {id(p) for p in t.model.parameters()}
    before = params(t)
    assert check_finite(t.train(2))
    assert any(not torch.equal(before[k], v) for k, v in params(t).items())


def test_optimizer_impl_gives_the_same_updates_as_default():
    wl = make(optimizer=lambda p: torch.optim.Adam(p, lr=0.01))
    ref = trainer(wl)
    ref_losses = ref.train(3)
    for impl in ("foreach", "fused"):
        t = trainer(wl, optimizer__impl=impl)
        assert_close(t.train(3), ref_losses, rtol=1e-5, atol=1e-5)
        assert_close(params(t), params(ref), rtol=1e-5, atol=1e-5)


def test_optimizer_without_the_flag_is_a_config_error():
    class Plain(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

        def step(self, closure=None):
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.data.add_(p.grad, alpha=-g["lr"])

    with pytest.raises(ConfigError, match="optimizer.impl"):
        trainer(make(optimizer=lambda p: Plain(p)), optimizer__impl="foreach")


# --- backend.num_threads -----------------------------------------------------------------


def test_num_threads_sets_the_intra_op_threads():
    trainer(make(), backend__num_threads=1)
    assert torch.get_num_threads() == 1
    trainer(make(), backend__num_threads=3)
    assert torch.get_num_threads() == 3
    trainer(make())  # null: torch's default, as found when autotune was imported
    assert torch.get_num_threads() == default_threads()


# --- compile.mode ------------------------------------------------------------------------


@pytest.mark.slow
def test_compile_default_trains():
    wl = make()
    eager = trainer(wl).train(3)
    t = trainer(wl, compile__mode="default")
    assert t.step_model is not t.model
    assert isinstance(t.step_model, torch._dynamo.eval_frame.OptimizedModule)
    losses = t.train(3)
    assert check_finite(losses)
    assert_close(losses, eager, rtol=1e-4, atol=1e-4)


# --- data loading ------------------------------------------------------------------------


def _first_batches(t: Trainer, n: int):
    stream = t.batches()
    out = [next(stream) for _ in range(n)]
    stream.close()
    return out


def test_workers_give_the_same_data_order_as_the_main_process():
    wl = make()  # 64 samples, batch 16: 4 batches an epoch, so 6 steps cross an epoch
    a = _first_batches(trainer(wl), 6)
    b = _first_batches(trainer(wl, data__num_workers=2), 6)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # a new epoch is reshuffled, not a repeat
    assert not torch.equal(a[0][0], a[4][0])
    assert_close(trainer(wl, data__num_workers=2).train(6), trainer(wl).train(6))


def test_workers_with_prefetch_keep_the_order():
    wl = make()
    a = _first_batches(trainer(wl), 6)
    b = _first_batches(trainer(wl, data__num_workers=2, data__prefetch_factor=4), 6)
    for (xa, _), (xb, _) in zip(a, b):
        assert torch.equal(xa, xb)


def test_persistent_workers_keep_the_order_across_epochs():
    """A config never changes the data seen: not in the second epoch either.

    64 samples at batch 16 is 4 batches an epoch; batches 5-8 are the second epoch.
    """
    wl = make()
    a = _first_batches(trainer(wl), 8)
    b = _first_batches(trainer(wl, data__num_workers=2, data__persistent_workers=True), 8)
    same = [torch.equal(xa, xb) for (xa, _), (xb, _) in zip(a, b)]
    assert same == [True] * 8, f"batches equal to the num_workers=0 order: {same}"


def test_seed_changes_the_data_order_and_init():
    wl = make()
    a, b = trainer(wl, seed=0), trainer(wl, seed=1)
    assert not torch.equal(_first_batches(a, 1)[0][0], _first_batches(b, 1)[0][0])
    assert any(not torch.equal(x, y) for x, y in zip(params(a).values(), params(b).values()))


def test_in_flight_counts_prefetched_batches():
    assert trainer(make()).in_flight == 0
    assert trainer(make(), data__num_workers=2).in_flight == 4
    assert trainer(make(), data__num_workers=2, data__prefetch_factor=4).in_flight == 8


def test_dataset_smaller_than_one_batch_is_a_user_error():
    with pytest.raises(UserError, match="fewer than one batch"):
        trainer(make(dataset=lambda: Vectors(10)))


def test_dataset_given_as_an_instance_works():
    assert check_finite(trainer(make(dataset=Vectors(32))).train(3))


def test_iterable_dataset_that_yields_nothing_is_a_user_error():
    t = trainer(make(dataset=Empty()))
    with pytest.raises(UserError, match="yielded no batch"):
        t.train(1)


# --- the user's loss and model -----------------------------------------------------------


def test_non_scalar_loss_is_a_user_error():
    wl = make(loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], reduction="none"))
    with pytest.raises(UserError, match=r"not a scalar tensor.*\.mean\(\)"):
        trainer(wl).train(1)


def test_loss_that_is_not_a_tensor_is_a_user_error():
    with pytest.raises(UserError, match="not a scalar tensor"):
        trainer(make(loss=lambda model, batch: 1.0)).train(1)


def test_exception_in_the_users_loss_is_a_user_code_error():
    def loss(model, batch):
        raise KeyError("no such column")

    with pytest.raises(UserCodeError) as info:
        trainer(make(loss=loss)).train(1)
    assert isinstance(info.value.exc, KeyError)
    assert "loss" in info.value.where
    assert "test_loop.py" in info.value.user_traceback()


def test_model_factory_returning_something_else_is_a_user_error():
    with pytest.raises(UserError, match="not a torch.nn.Module"):
        trainer(make(model=lambda: "a model"))


def test_workload_checks_its_fields():
    with pytest.raises(UserError, match="batch_size"):
        make(batch_size=0)
    with pytest.raises(UserError, match="loss must be callable"):
        make(loss=None)


# --- training ----------------------------------------------------------------------------


def test_train_returns_finite_decreasing_losses_on_an_easy_problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    data = torch.utils.data.TensorDataset(x, x @ w + 0.1)
    wl = autotune.Workload(
        name="linreg",
        model=lambda: nn.Linear(4, 1),
        dataset=data,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        loss=lambda model, batch: F.mse_loss(model(batch[0]), batch[1]),
        batch_size=32,
    )
    t = Trainer(wl, autotune.TrainConfig(), CPU)
    losses = t.train(40)
    assert len(losses) == 40 and all(isinstance(v, float) for v in losses)
    assert check_finite(losses)
    assert losses[-1] < losses[0] / 20
    assert sum(losses[-5:]) < sum(losses[:5])
    assert t.steps_done == 40


def test_check_finite():
    assert check_finite([1.0, 2.0])
    assert not check_finite([1.0, math.nan])
    assert not check_finite([math.inf])
