"""ModuleWatch: cheap per-call staleness, verdicts (divert, refit, blocked), cached while nothing moves."""

from __future__ import annotations

import gc

import torch

from aitune_core.backends import module_epoch
from aitune_core.backends.module_watch import ModuleSnapshot, ModuleWatch, submodule_hooks


class _Backend:
    def __init__(self, bakes: bool) -> None:
        self.bakes_weights = bakes

    def describe(self) -> str:
        return f"Fake(bakes={self.bakes_weights})"


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2)).eval()


def _refits(result: bool = True):
    calls = []

    def refit(backend) -> bool:
        calls.append(backend)
        return result

    return calls, refit


def test_fresh_watch_is_not_stale_and_in_place_edits_are_seen_only_for_baked_weights():
    net = _net()
    reading, baked = ModuleWatch(net, [_Backend(False)]), ModuleWatch(net, [_Backend(True)])
    assert not reading.stale() and not baked.stale()
    with torch.no_grad():
        net[0].weight.add_(1)
    assert not reading.stale()  # reads the weights at call time: an in-place edit changes nothing for it
    assert baked.stale()
    calls, refit = _refits()
    verdict = baked.review(refit)
    assert verdict.clean and len(calls) == 1 and not baked.stale()


def test_hooks_on_submodules_divert_until_removed_and_the_root_hooks_do_not():
    net = _net()
    backend = _Backend(True)
    watch = ModuleWatch(net, [backend])
    net.register_forward_hook(lambda *a: None)  # the root's own hooks fire around the tuned forward
    calls, refit = _refits()
    assert watch.review(refit).clean
    handle = net[2].register_forward_pre_hook(lambda *a: None)
    assert watch.stale()
    assert watch.review(refit).divert is not None
    assert watch.stale()  # a diverted verdict keeps the check on the slow path...
    assert watch.review(refit).divert is not None  # ...where it is cached
    handle.remove()
    assert watch.review(refit).clean and not watch.stale()
    assert calls == []  # no weight changed: nothing to refit


def test_training_flags_divert_and_eval_restores():
    net = _net()
    watch = ModuleWatch(net, [_Backend(False)])
    _calls, refit = _refits()
    net[1].train()
    assert watch.stale() and watch.review(refit).divert == "a training flag differs from tune time"
    net.eval()
    assert watch.review(refit).clean


def test_structure_and_identity_changes_refit_baked_backends_and_a_failed_refit_blocks():
    net = _net()
    baked, reading = _Backend(True), _Backend(False)
    watch = ModuleWatch(net, [baked, reading])
    net[2] = torch.nn.Linear(4, 2).eval()
    calls, refit = _refits(result=False)
    verdict = watch.review(refit)
    assert calls == [baked] and verdict.blocked == frozenset({id(baked)}) and verdict.divert is None
    assert watch.stale() and watch.review(refit) is verdict and len(calls) == 1  # cached: no retry per call
    net.load_state_dict(net.state_dict(), assign=True)  # the next change retries
    calls2, refit2 = _refits(result=True)
    assert watch.review(refit2).clean and calls2 == [baked]


def test_dtype_change_is_a_weight_change():
    net = _net()
    watch = ModuleWatch(net, [_Backend(True)])
    net.double()
    calls, refit = _refits()
    watch.review(refit)
    assert len(calls) == 1


def test_submodule_hooks_counts_descendants_and_global_hooks():
    net = _net()
    assert submodule_hooks(net) == 0
    net.register_forward_hook(lambda *a: None)
    assert submodule_hooks(net) == 0
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert submodule_hooks(net) == 1
    finally:
        handle.remove()
    net[0].register_full_backward_hook(lambda *a: None)
    assert submodule_hooks(net) == 1


def test_snapshot_same_weights():
    net = _net()
    first = ModuleSnapshot.take(net)
    assert first.same_weights(ModuleSnapshot.take(net))
    with torch.no_grad():
        net[0].bias.zero_()
    assert not first.same_weights(ModuleSnapshot.take(net))


def test_the_patches_go_when_the_last_watch_goes():
    watch = ModuleWatch(_net(), [])
    assert module_epoch.installed()
    del watch
    gc.collect()
    assert not module_epoch.installed()


def test_a_replacing_watch_keeps_the_weights_each_backend_holds():
    net = _net()
    waiting, kept = _Backend(True), _Backend(True)
    old = ModuleWatch(net, [waiting, kept])
    net[0].weight = torch.nn.Parameter(torch.zeros(4, 4))
    _calls, failing = _refits(result=False)
    assert old.review(failing).blocked == frozenset({id(waiting), id(kept)})
    new_backend = _Backend(True)  # built now, from the current weights
    new = ModuleWatch(net, [waiting, new_backend], previous=old)  # `kept` dropped, one added
    assert new.stale()
    calls, refit = _refits()
    assert new.review(refit).clean and calls == [waiting]


def test_a_watch_does_not_keep_replaced_weights_alive():
    import weakref

    net = _net()
    watch = ModuleWatch(net, [_Backend(True)])
    old = weakref.ref(net[0].weight)
    net[0].weight = torch.nn.Parameter(torch.zeros(4, 4))
    _calls, refit = _refits()
    watch.review(refit)
    gc.collect()
    assert old() is None


def test_a_backend_that_pins_its_output_dtypes_is_blocked_after_a_dtype_change():
    net = _net()
    pinned, follows = _Backend(bakes=False), _Backend(bakes=False)
    pinned.pins_output_dtypes = True  # (Inductor under its own autocast casts back to the dtypes of tune time)
    watch = ModuleWatch(net, [pinned, follows])
    _calls, refit = _refits()
    assert watch.review(refit).clean
    net.double()
    assert watch.stale()
    assert watch.review(refit).blocked == frozenset({id(pinned)})


def test_a_plain_value_change_refits_a_baked_backend_and_moves_no_epoch_elsewhere():
    """`LayerNorm.eps` is a constant of an exported graph: an ONNX-tuned model kept the old eps's answers (eighth
    review). Plain values of modules no baked backend holds do not move the epoch (a call counter elsewhere)."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).eval()
    other = torch.nn.Linear(2, 2)
    baked = _Backend(True)
    watch = ModuleWatch(net, [baked])
    epoch = module_epoch.EPOCH.value
    other.calls = 1
    other.calls = 2
    net[1].eps = net[1].eps  # the same value: nothing changed
    assert module_epoch.EPOCH.value == epoch and not watch.stale()
    net[1].eps = 0.5
    assert watch.stale()
    calls, refit = _refits()
    assert watch.review(refit).clean and calls == [baked]
    norm = torch.nn.LayerNorm(4)
    reading = ModuleWatch(norm, [_Backend(False)])
    epoch = module_epoch.EPOCH.value
    norm.eps = 0.1  # a backend that reads the module at call time (Inductor guards on it)
    assert module_epoch.EPOCH.value == epoch and not reading.stale()


class _Compiled(_Backend):
    """A backend made for the module's structure at build time (as every backend but eager is)."""

    compiled_for_structure = True


def test_a_change_of_dtype_blocks_compiled_backends_says_what_changed_and_lifts_when_changed_back():
    net = _net()
    compiled, follows = _Compiled(bakes=False), _Backend(bakes=False)
    watch = ModuleWatch(net, [compiled, follows])
    calls, refit = _refits()
    net.double()
    verdict = watch.review(refit)
    assert verdict.reshaped == "its dtypes changed (torch.float32 -> torch.float64)"
    assert verdict.blocked == frozenset({id(compiled)}) and verdict.divert is None and calls == []
    net.float()
    verdict = watch.review(refit)
    assert verdict.clean and verdict.reshaped is None and not watch.stale()


def test_a_device_change_is_named_too():
    net = _net()
    watch = ModuleWatch(net, [_Compiled(bakes=False)])
    net.to("meta")
    _calls, refit = _refits()
    assert watch.review(refit).reshaped == "its devices changed (cpu -> meta)"


def test_a_submodule_of_another_class_or_shape_is_a_new_structure_and_one_of_the_same_kind_is_not():
    net = _net()
    compiled = _Compiled(bakes=False)
    watch = ModuleWatch(net, [compiled])
    _calls, refit = _refits()
    net[0] = torch.nn.Linear(4, 4).eval()  # same class, same shapes: what a compiled graph guards holds
    assert watch.review(refit).clean
    net[1] = torch.nn.Identity()
    verdict = watch.review(refit)
    assert verdict.reshaped == "a submodule changed class (1: Dropout -> Identity)"
    assert verdict.blocked == frozenset({id(compiled)})
    net[1] = torch.nn.Dropout(0.5).eval()
    assert watch.review(refit).clean
    net[2] = torch.nn.Linear(4, 3).eval()
    assert watch.review(refit).reshaped == "a parameter or buffer changed shape"
    net[2] = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
    assert watch.review(refit).reshaped == "a submodule changed class (2: Linear -> Sequential)"


def test_a_baked_backend_is_refit_after_a_new_structure_only_when_the_owner_asks_for_it():
    """The AOT wrapper refits on the caller's thread (its default); the JIT, which tunes the module again, does not
    (`refit_reshaped=False`): a rebuild there would be a compile inside a request."""
    net = _net()
    baked = _Compiled(bakes=True)
    watch = ModuleWatch(net, [baked])
    net.double()
    calls, refit = _refits()
    verdict = watch.review(refit, refit_reshaped=False)
    assert calls == [] and verdict.blocked == frozenset({id(baked)}) and verdict.reshaped is not None
    other = _Compiled(bakes=True)
    net2 = _net()
    watch2 = ModuleWatch(net2, [other])
    net2.double()
    verdict = watch2.review(refit)
    assert calls == [other] and verdict.blocked == frozenset() and verdict.reshaped is not None  # rebuilt at float64


def test_a_watch_that_replaces_one_after_a_change_of_structure_reviews_its_first_call():
    """A job that ran while the module was cast installs a new dispatcher (and watch) for it: the watch must not
    take the cast module for the tuned one and let a float32 backend serve it."""
    net = _net()
    compiled = _Compiled(bakes=False)
    first = ModuleWatch(net, [compiled])
    net.double()
    replacing = ModuleWatch(net, [compiled], previous=first)
    assert replacing.stale()
    _calls, refit = _refits()
    assert replacing.review(refit).blocked == frozenset({id(compiled)})


def test_a_submodule_added_after_tuning_is_watched_after_the_review():
    """The watch follows its tree: a submodule put in after tuning is watched once a review has seen it, so a later
    change of that submodule alone moves the epoch."""
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    watch = ModuleWatch(net, [])
    added = torch.nn.Linear(2, 2)
    net.append(added)
    assert watch.stale()
    watch.review(lambda backend: True)
    assert not watch.stale()
    added.weight = torch.nn.Parameter(torch.zeros(2, 2))
    assert watch.stale()


def test_a_replaced_submodule_forward_diverts_and_a_weight_of_another_tensor_type_is_a_new_structure():
    """accelerate's `add_hook_to_module` sets an instance `forward`; torchao's `quantize_` swaps a weight for a
    tensor subclass. Neither changed class, shape, dtype or device, so the compiled graph's guards failed on them
    and dynamo recompiled inside the program's call (a forward drawing random numbers drew them from Inductor's
    generator). A replaced forward is treated like a hook: the original module answers while it is there."""
    import types

    class Marked(torch.Tensor):
        pass

    net = _net()
    watch = ModuleWatch(net, [_Backend(False)])
    epoch = module_epoch.EPOCH.value
    net[2].forward = types.MethodType(lambda self, x: torch.nn.Linear.forward(self, x) * 2, net[2])
    assert module_epoch.EPOCH.value != epoch and watch.stale()  # (the assignment moved the epoch)
    verdict = watch.review(_refits()[1])
    assert verdict.divert is not None and "forward was replaced" in verdict.divert  # (the original answers)
    del net[2].forward
    assert watch.review(_refits()[1]).clean  # served again, as when a hook is removed
    net.forward = types.MethodType(lambda self, x: torch.nn.Sequential.forward(self, x), net)
    assert watch.review(_refits()[1]).clean  # (the module's own: a wrapper around what serves it)
    net[0].weight = torch.nn.Parameter(net[0].weight.detach().as_subclass(Marked))
    verdict = watch.review(_refits()[1])
    assert verdict.reshaped is not None and "another tensor type (Parameter -> Marked)" in verdict.reshaped


def test_a_global_hook_registered_through_a_name_imported_before_the_patches_is_seen():
    # `from torch.nn.modules.module import register_module_forward_hook` at a script's start holds torch's own
    # function: its hooks moved no epoch, and a tuned graph answered without the hook (a helper's script, sixth
    # round: every block's output doubled by the hook plainly, not under the JIT)
    import inspect

    from torch.nn.modules import module as torch_module

    register = inspect.unwrap(torch_module.register_module_forward_hook)  # (torch's function, not the patch)
    net = _net()
    watch = ModuleWatch(net, [_Backend(False)])
    _calls, refit = _refits()
    assert watch.review(refit).clean and not watch.stale()
    epoch = module_epoch.EPOCH.value
    handle = register(lambda module, args, out: None)
    try:
        assert module_epoch.EPOCH.value == epoch  # (no patch saw it)
        assert watch.stale()
        assert watch.review(refit).divert is not None
    finally:
        handle.remove()
    assert watch.stale()  # (the count moved back: looked at once more)
    assert watch.review(refit).clean and not watch.stale()


def test_a_watch_made_after_hooks_came_while_its_backends_were_built_reviews_its_first_call():
    # a hook registered while a background job compiled is on before the watch exists, and the process's first
    # tuning had no epoch patches to see it: the watch looked clean and the tuned graph answered without the hook
    net = _net()
    handle = net[0].register_forward_hook(lambda *a: None)
    assert not ModuleWatch(net, [_Backend(False)]).stale()  # (no tune-time count: hooks there all along)
    assert not ModuleWatch(net, [_Backend(False)], hooks_at_tune=1).stale()
    watch = ModuleWatch(net, [_Backend(False)], hooks_at_tune=0)
    assert watch.stale()
    _calls, refit = _refits()
    assert watch.review(refit).divert is not None
    handle.remove()
    assert watch.review(refit).clean and not watch.stale()


def test_a_layer_appended_or_removed_is_named_by_its_name_not_by_position():
    # compared by position, `layers.append(...)` read as every later module changing class ("layers.2:
    # ParameterList -> Linear"; a helper's script, sixth round)
    net = torch.nn.Module()
    net.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    net.scales = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(4))])
    tuned = ModuleSnapshot.take(net)
    net.layers.append(torch.nn.Linear(4, 4))
    assert ModuleSnapshot.take(net).reshape_from(tuned) == "its submodules changed (added layers.2: Linear)"
    del net.layers[0]
    net.layers[0] = torch.nn.Identity()
    assert ModuleSnapshot.take(net).reshape_from(tuned) == "a submodule changed class (layers.0: Linear -> Identity)"
    del net.layers[1]
    del net.layers[0]
    assert ModuleSnapshot.take(net).reshape_from(tuned) == "its submodules changed (removed layers.0, layers.1)"
