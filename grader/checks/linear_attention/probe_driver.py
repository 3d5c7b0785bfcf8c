"""The probe driver of linear_attention: how a case builds and runs the student's layer.

This file is sent to the probe harness and run there, inside the sandbox, before any student
code (see ``load_handlers`` in grader/harness/probe_harness.py): it is not imported by the
grader. It holds no expected values, only how to call things. It reaches the harness's
helpers through the ``harness`` namespace the harness gives it, and binds every library
function it uses here, at load time, so that student code patching torch in a worker does not
change how this code calls it.
"""
import os
import time
import types

import torch

_tensor, _stack, _no_grad, _clone = torch.tensor, torch.stack, torch.no_grad, torch.Tensor.clone
_register_hook = torch.Tensor.register_hook
_grad_enabled = torch.is_grad_enabled
_manual_seed, _cross_entropy, _Tensor = torch.manual_seed, torch.nn.functional.cross_entropy, torch.Tensor
_Generator, _randn, _FLOAT64 = torch.Generator, torch.randn, torch.float64
_LONG, _FLOAT32, _perf_counter, _sorted = torch.long, torch.float32, time.perf_counter, sorted
_isinstance, _type, _len, _int, _float, _list, _dict = isinstance, type, len, int, float, list, dict
_getattr, _setattr, _min, _max, _range, _id = getattr, setattr, min, max, range, id
save_output, given_state, save_state, DTYPES = (harness.save_output, harness.given_state,  # noqa: F821
                                                harness.save_state, harness.DTYPES)        # noqa: F821
describe_error = harness.describe_error  # noqa: F821


def build_attention(module, inputs, config):
    dtype = DTYPES[config["dtype"]]
    la = module.LinearAttention(config["embedding_dim"], config["num_heads"]).to(dtype=dtype)
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        layer = getattr(la, proj)
        layer.weight = _tensor(inputs[proj + ".weight"], dtype=dtype).requires_grad_()
        layer.bias = _tensor(inputs[proj + ".bias"], dtype=dtype).requires_grad_()
    la.gamma_logit = _tensor(inputs["gamma_logit"], dtype=dtype).requires_grad_()
    return la, dtype


def case_forward(module, inputs, config):
    la, dtype = build_attention(module, inputs, config)
    with _no_grad():
        save_output("y", la(_tensor(inputs["x"], dtype=dtype)))
        save_output("decay", la.decay)
    return {}


def case_steps(module, inputs, config):
    """step over every token of ``x``, from the relayed state (a segment) or from None."""
    la, dtype = build_attention(module, inputs, config)
    x, state, outputs = _tensor(inputs["x"], dtype=dtype), given_state(inputs, dtype), []
    with _no_grad():
        for t in range(x.shape[1]):
            y, state = la.step(x[:, t], state)
            outputs.append(y)
    save_output("y", _stack(outputs, dim=1))
    save_state(state, "step must return its state as a tuple of tensors (S, z)")
    return {}


def save_state_parts(stage, state):
    """Each tensor of ``state`` as ``<stage>.<i>``, copied now: save_output keeps a view of the
    tensor, which a later in-place change would reach."""
    parts = list(state) if _isinstance(state, (tuple, list)) else [state]
    for i, part in enumerate(p for p in parts if _isinstance(p, _Tensor)):
        save_output(f"{stage}.{i}", _clone(part))


def case_state_contract(module, inputs, config):
    """step down a chain of tokens from None, keeping every state object it returns and a copy
    of it taken on return (``returned.<t>``); then token ``twice_from + 1`` stepped twice from
    the state kept after token ``twice_from`` (``twice.<n>``); then the tokens after
    ``back_to`` stepped again from the state kept after it (``again``); last, every kept state
    object read again (``kept.<t>``). The trusted side compares them: this code judges nothing."""
    la, dtype = build_attention(module, inputs, config)
    x = _tensor(inputs["x"], dtype=dtype)
    kept, outputs = [], []
    with _no_grad():
        state = None
        for t in range(x.shape[1]):
            y, state = la.step(x[:, t], state)
            save_state_parts(f"returned.{t}", state)
            kept.append(state)
            outputs.append(y)
        save_output("chain.y", _stack(outputs, dim=1))
        token = config["twice_from"] + 1
        for n in range(2):
            y, state = la.step(x[:, token], kept[config["twice_from"]])
            save_output(f"twice.{n}.y", _clone(y))
            save_state_parts(f"twice.{n}", state)
        state, outputs = kept[config["back_to"]], []
        for t in range(config["back_to"] + 1, x.shape[1]):
            y, state = la.step(x[:, t], state)
            outputs.append(y)
        save_output("again.y", _stack(outputs, dim=1))
        save_state_parts("again", state)
    for t, state in enumerate(kept):
        save_state_parts(f"kept.{t}", state)
    return {}


def case_grader_state(module, inputs, config):
    """One step on token 0 of ``x`` from the state the grader built (``given.<i>``) and one
    from a zero state of the same shapes: the state each returned (``from_given.<i>``,
    ``from_zero.<i>``) and the tensors handed in, read after the call (``given_after.<i>``).
    The trusted side compares them: this code judges nothing."""
    la, dtype = build_attention(module, inputs, config)
    x = _tensor(inputs["x"], dtype=dtype)
    given = (_tensor(inputs["given.0"], dtype=dtype), _tensor(inputs["given.1"], dtype=dtype))
    zero = (given[0] * 0, given[1] * 0)
    with _no_grad():
        _, state = la.step(x[:, 0], given)
        save_state_parts("from_given", state)
        save_state_parts("given_after", given)
        _, state = la.step(x[:, 0], zero)
        save_state_parts("from_zero", state)
    return {}


def describe_state(state):
    parts = list(state) if _isinstance(state, (tuple, list)) else [state]
    shapes = [list(p.shape) if _isinstance(p, _Tensor) else _type(p).__name__ for p in parts]
    return {"container": _type(state).__name__, "shapes": shapes,
            "numel": int(sum(p.numel() for p in parts if _isinstance(p, _Tensor)))}


_NOT_DATA = (type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType)


def retained_elements(root, seen=None, depth=0):
    """Tensor elements reachable from an object's attributes, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(root) in seen or depth > 6:
        return 0
    seen.add(id(root))
    if _isinstance(root, _Tensor):
        return root.numel()
    if _isinstance(root, (list, tuple, set, frozenset)):
        return sum(retained_elements(v, seen, depth + 1) for v in root)
    if _isinstance(root, dict):
        return sum(retained_elements(v, seen, depth + 1) for v in root.values())
    if hasattr(root, "__dict__") and not _isinstance(root, _NOT_DATA):
        return retained_elements(vars(root), seen, depth + 1)
    return 0


def module_globals_elements(module):
    """Tensor elements held in the student module's globals (a global history cache counts)."""
    return sum(retained_elements(value) for name, value in vars(module).items()
               if not name.startswith("__") and not _isinstance(value, _NOT_DATA))


def case_state_growth(module, inputs, config):
    """The state after some numbers of steps, exported as arrays (``checkpoint_<steps>.<i>``)
    whose shapes the trusted side measures; and, reported from inside the student's process
    (a diagnostic for honest mistakes, which can only fail the item), how the state is held
    and how much tensor data the layer keeps besides it."""
    la, dtype = build_attention(module, inputs, config)
    x = _tensor(inputs["x"], dtype=dtype)
    checkpoints = set(config["checkpoints"])
    report = {}
    state = None
    baseline = retained_elements(la) + module_globals_elements(module)
    with _no_grad():
        for t in range(x.shape[1]):
            _, state = la.step(x[:, t], state)
            if t + 1 in checkpoints:
                parts = list(state) if _isinstance(state, (tuple, list)) else [state]
                for i, part in enumerate(p for p in parts if _isinstance(p, _Tensor)):
                    save_output(f"checkpoint_{t + 1}.{i}", part)
                entry = describe_state(state)
                entry["retained_growth"] = (retained_elements(la) + module_globals_elements(module)
                                            - baseline)
                report[str(t + 1)] = entry
    return {"checkpoints": report}


# The call counter handed to student objects is built in a namespace of its own, so its
# __globals__ lead nowhere near this driver.
_COUNTER_NAMESPACE = {"__builtins__": {}}
exec("def counter(bound, calls):\n"
     "    def counted(x):\n"
     "        calls[0] += 1\n"
     "        return bound(x)\n"
     "    return counted\n", _COUNTER_NAMESPACE)
_counter = _COUNTER_NAMESPACE["counter"]


def case_hybrid(module, inputs, config):
    """The model built from the seed, run forward and backward: its logits, its loss and the
    gradient of each of its parameters (``grad.<i>``, in the order the model lists them when
    built, before any student code runs on it; a parameter without a gradient sends none), for
    the trusted side to compare with its own model's. The count of forward calls is a report
    from inside the student's process, which can only fail the item."""
    _manual_seed(config["seed"])
    lm = module.HybridTransformerLM(config["vocab_size"], config["embedding_dim"],
                                    config["layer_pattern"], config["num_heads"],
                                    config["max_seq_len"], hidden_dim=config["hidden_dim"])
    lm.to(dtype=DTYPES[config["dtype"]])
    parameters = [param for _, param in lm.named_parameters()]
    calls = [0]
    for block in lm.blocks:
        if _isinstance(block.attn, module.LinearAttention):
            block.attn.forward = _counter(block.attn.forward, calls)
    tokens = _tensor(inputs["tokens"], dtype=_LONG)
    logits = lm(tokens)
    loss = _cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    save_output("logits", logits)
    save_output("loss", loss)
    for i, param in enumerate(parameters):
        if param.grad is not None:
            save_output(f"grad.{i}", param.grad)
    return {"linear_forward_calls": calls[0]}


def _shape(value):
    return [_int(n) for n in value.shape] if _isinstance(value, _Tensor) else None


def _cache_seen(x_t, cache=None, *args, **kwargs):
    """The cache as a timed decode_step found it: its length and its slots."""
    keys = _getattr(cache, "keys", None)
    seen = {"x": _shape(x_t)}
    try:
        seen["length"] = _int(_getattr(cache, "length", -1))
    except Exception:  # noqa: BLE001 - a length that is not a number is reported as unknown
        seen["length"] = None
    if _isinstance(keys, _Tensor) and keys.dim() == 4:
        seen["capacity"] = _int(keys.shape[2])
    return seen


def _state_seen(x_t, state=None, *args, **kwargs):
    return {"x": _shape(x_t), "state": "none" if state is None else "given"}


def _numbers(values):
    """A returned list of numbers as floats, or None when it is not one."""
    try:
        return [_float(v) for v in values] if _isinstance(values, (_list, tuple)) else None
    except Exception:  # noqa: BLE001 - whatever the list holds, it is not numbers
        return None


def case_benchmark(module, inputs, config):
    """Exercise 1's ``decode_step_sweep`` run on layers the grader builds, with what runs inside
    each timed call observed from the grader's side of the calls: the layers' methods (on the
    classes, so that layers the sweep builds itself show) and the cache's construction are
    wrapped, and ``time_median_ms`` is replaced by a timer that marks its timed calls (with the
    notebook's grading-mode repeats and warmup, ``config["repeats"]`` and ``"warmup"``, at most).
    Per measurement (one timer call), per timed call: how often each observed method ran, what
    the first decode_step and step were given, the call's time (``ms``) and the time spent
    inside the observed methods (``inside_ms``), both on the clock this driver bound before any
    student code ran, so that replacing ``time.perf_counter`` changes neither.

    The sweep is called twice on the same layers, built as the notebook builds them (after
    ``torch.manual_seed(0)``): first as the notebook's grading-mode run calls it
    (``config["notebook_lengths"]``; ``notebook_run``), then with the grader's own lengths (the
    top-level record). The trusted side judges the method from both, and holds the notebook's
    reported times to the first. ``raised_in``: the layer method whose exception stopped it."""
    sweep = _getattr(module, "decode_step_sweep", None)
    if sweep is None:
        return {"missing": True}
    _manual_seed(0)
    full = module.MultiHeadAttention(config["embedding_dim"], config["num_heads"]).to(dtype=_FLOAT32)
    lin = module.LinearAttention(config["embedding_dim"], config["num_heads"]).to(dtype=_FLOAT32)
    measurements, current, raised, depth = [[]], [None], [None], [0]

    def observe(cls, method, name, given, seen=None):
        """Wrap ``cls.method`` for every instance, counting the outermost calls only (a step that
        calls the layer's other methods is one step): a call on another instance than the one
        handed over counts as ``<name>_other``; ``seen`` describes a step's arguments."""
        original = _getattr(cls, method)

        def wrapper(self, *args, **kwargs):
            calls, outer = current[0], depth[0] == 0
            if calls is not None and outer:
                key = name if self is given else name + "_other"
                calls["counts"][key] = calls["counts"].get(key, 0) + 1
                if seen is not None and key not in calls:
                    try:
                        calls[key] = seen(*args, **kwargs)
                    except Exception:  # noqa: BLE001 - arguments it cannot read are reported as such
                        calls[key] = {"unreadable": True}
            depth[0] += 1
            started = _perf_counter()
            try:
                return original(self, *args, **kwargs)
            except BaseException as exc:
                if given is lin and method in ("step", "forward"):
                    raised[0] = (f"LinearAttention.{method}", exc)
                raise
            finally:
                depth[0] -= 1
                if calls is not None and outer:
                    calls["inside_ms"] += (_perf_counter() - started) * 1e3
        _setattr(cls, method, wrapper)

    observe(module.MultiHeadAttention, "decode_step", "decode_step", full, _cache_seen)
    observe(module.MultiHeadAttention, "forward", "full_forward", full)
    observe(module.LinearAttention, "step", "step", lin, _state_seen)
    observe(module.LinearAttention, "forward", "linear_forward", lin)
    observe(module.LinearAttention, "init_state", "init_state", lin)
    cache_class = module.KVCache

    class ObservedCache(cache_class):
        def __init__(self, *args, **kwargs):
            if current[0] is not None and depth[0] == 0:
                current[0]["counts"]["cache_built"] = current[0]["counts"].get("cache_built", 0) + 1
            cache_class.__init__(self, *args, **kwargs)
    module.KVCache = ObservedCache
    most_repeats, most_warmup = config["repeats"], config["warmup"]

    def timer(fn, *, device=None, repeats=most_repeats, warmup=most_warmup, setup=None):
        measurement = {"timed_calls": [], "median_ms": None}
        measurements[0].append(measurement)
        for _ in _range(_min(_int(warmup), most_warmup)):
            if setup is not None:
                setup()
            fn()
        times = []
        for _ in _range(_max(1, _min(_int(repeats), most_repeats))):
            if setup is not None:
                setup()
            calls = {"counts": {}, "inside_ms": 0.0}
            current[0] = calls
            start = _perf_counter()
            try:
                fn()
            finally:
                current[0] = None
            calls["ms"] = (_perf_counter() - start) * 1e3
            times.append(calls["ms"])
            measurement["timed_calls"].append(calls)
        median = _sorted(times)[_len(times) // 2]
        measurement["median_ms"] = median
        return median
    provided = _getattr(module, "time_median_ms", None)
    for attribute in ("__name__", "__qualname__", "__doc__", "__module__"):   # as the provided helper reads
        _setattr(timer, attribute, _getattr(provided, attribute, _getattr(timer, attribute)))
    module.time_median_ms = timer

    def run(lengths):
        measurements[0] = []
        error, returned, raised_in = None, {}, None
        try:
            with _no_grad():
                result = sweep(full, lin, _list(lengths))
            if _isinstance(result, _dict):
                returned = {key: _numbers(result.get(key)) for key in config["returned"]}
        except Exception as exc:  # noqa: BLE001 - the sweep's failure is a finding, with what was observed
            error = describe_error(exc)
            if raised[0] is not None and raised[0][1] is exc:
                raised_in = raised[0][0]
        return {"measurements": measurements[0], "returned": returned, "error": error, "raised_in": raised_in}

    notebook_run = run(config["notebook_lengths"])
    return {**run(config["history_lengths"]), "notebook_run": notebook_run}


# Exercise 4's state_norms: at most this many of the steps it runs on the given layer are kept.
NORMS_MAX_STEPS = 120


def _state_parts(state):
    return _list(state) if _isinstance(state, (tuple, _list)) else [state]


def _given_state(state, returned):
    """How a step's state came: ``none``, ``returned`` (the state, or its tensors, that the
    layer's previous step returned), ``zeros`` (another state of zeros: init_state's) or
    ``other``."""
    if state is None:
        return "none"
    parts, last = _state_parts(state), _state_parts(returned) if returned is not None else []
    if state is returned or (parts and last and parts[0] is last[0]):
        return "returned"
    if all(_isinstance(p, _Tensor) for p in parts) and not any(bool(p.any()) for p in parts):
        return "zeros"
    return "other"


def case_decay_norms(module, inputs, config):
    """Exercise 4's ``state_norms`` on a layer and tokens of the grader's, each step of that
    layer observed from the grader's side: the gamma_logit it ran with and how its state came
    (``_given_state``; ``steps``), its input and the S and z it returned (``step.<n>.x/S/z``). The
    trusted side recomputes the norms from those states; the sweep's lists come back as
    ``returned``."""
    function = _getattr(module, "state_norms", None)
    if function is None:
        return {"missing": True}
    la, dtype = build_attention(module, inputs, config)
    x = _tensor(inputs["x"], dtype=dtype)
    steps, raised, depth = [], [None], [0]
    original = module.LinearAttention.step

    last = [None]   # the state the given layer's previous step returned

    def observed_step(self, x_t, state=None, *args, **kwargs):
        outer, given = depth[0] == 0, _given_state(state, last[0]) if self is la else None
        depth[0] += 1
        try:
            result = original(self, x_t, state, *args, **kwargs)
        except BaseException as exc:
            raised[0] = exc
            raise
        finally:
            depth[0] -= 1
        if outer and self is la and _len(steps) < NORMS_MAX_STEPS:
            n = _len(steps)
            parts = _state_parts(result[1]) if _isinstance(result, (tuple, _list)) and _len(result) == 2 else []
            usable = _len(parts) == 2 and all(_isinstance(p, _Tensor) for p in parts)
            save_output(f"step.{n}.x", _clone(x_t.detach()))
            if usable:
                save_output(f"step.{n}.S", _clone(parts[0].detach()))
                save_output(f"step.{n}.z", _clone(parts[1].detach()))
            try:
                logits = [_float(v) for v in self.gamma_logit.detach().reshape(-1)]
            except Exception:  # noqa: BLE001 - a gamma_logit that is no tensor matches no logit given
                logits = []
            steps.append({"logits": logits, "given": given, "state": usable})
            last[0] = result[1] if usable else None
        return result
    _setattr(module.LinearAttention, "step", observed_step)
    error, returned, raised_in = None, None, None
    try:
        result = function(la, x, _dict(config["logits"]))
        if _isinstance(result, _dict):
            returned = {label: _numbers(result.get(label)) for label in config["logits"]}
    except Exception as exc:  # noqa: BLE001 - the function's failure is a finding, with what was observed
        error = describe_error(exc)
        raised_in = "LinearAttention.step" if raised[0] is exc else None
    return {"steps": steps, "returned": returned, "error": error, "raised_in": raised_in}


def case_learned_decays(module, inputs, config):
    """Exercise 4's ``learned_decays`` on models the grader builds (``config["patterns"]``),
    each linear layer's gamma_logit set to the grader's values (``logits.<name>.<i>``, bottom
    to top); what it returns comes back as nested lists of numbers (``returned``)."""
    function = _getattr(module, "learned_decays", None)
    if function is None:
        return {"missing": True}
    models = {}
    for name, pattern in config["patterns"].items():
        _manual_seed(config["seed"])
        model = module.HybridTransformerLM(config["vocab_size"], config["embedding_dim"], pattern,
                                           config["num_heads"], config["max_seq_len"], hidden_dim=config["hidden_dim"])
        linear = [block.attn for block in model.blocks if _isinstance(block.attn, module.LinearAttention)]
        for i, attn in enumerate(linear):
            attn.gamma_logit = _tensor(inputs[f"logits.{name}.{i}"], dtype=_FLOAT32).requires_grad_()
        models[name] = model
    try:
        result = function(models)
    except Exception as exc:  # noqa: BLE001 - the function's failure is a finding
        return {"error": describe_error(exc)}
    if not _isinstance(result, _dict):
        return {"returned": None, "type": _type(result).__name__}
    returned = {}
    for name in config["patterns"]:
        layers = result.get(name)
        rows = [_numbers(row) for row in layers] if _isinstance(layers, (_list, tuple)) else None
        returned[name] = rows
    return {"returned": returned}


class LightOptimizer:
    """Stands in for torch's optimizers in Exercise 2's case, which judges which batches each
    model sees, not how it learns: plain gradient steps, with torch's call shapes, each optimizer
    recorded with the parameters it trains (``_optimizers_of`` counts them per model)."""

    def __init__(self, params, lr=1e-3, **options):
        given = _list(params)
        groups = given if given and _isinstance(given[0], _dict) else [{"params": given}]
        self.param_groups = [{**group, "params": _list(group["params"]), "lr": group.get("lr", lr)} for group in groups]
        self.defaults, self.state = {"lr": lr, **options}, {}
        self.schedules = 0
        _BUILT.append(self)   # which model each optimizer trains, read by _optimizers_of

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        with _no_grad():
            for group in self.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        param.sub_(group["lr"] * param.grad)
        return loss


class LightSchedule:
    """Stands in for torch's learning-rate schedules beside ``LightOptimizer``: no change."""

    def __init__(self, optimizer, *args, **kwargs):
        self.optimizer = optimizer
        if _isinstance(optimizer, LightOptimizer):
            optimizer.schedules += 1

    def step(self, *args, **kwargs):
        pass

    def get_last_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]


_OPTIMIZERS = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad")
_BUILT = []   # every LightOptimizer built in this worker, in order


def _optimizers_of(model):
    """How many optimizers (LightOptimizer) were built over the model's parameters, and how
    many schedules over those optimizers: one of each trains a model for a whole run."""
    try:
        mine = {_id(param) for param in model.parameters()}
    except Exception:  # noqa: BLE001 - a model that cannot list its parameters has none of its own
        return {"optimizers": 0, "schedules": 0}
    built = [o for o in _BUILT if any(_id(param) in mine for group in o.param_groups for param in group["params"])]
    return {"optimizers": _len(built), "schedules": sum(o.schedules for o in built)}
_SCHEDULES = ("LambdaLR", "CosineAnnealingLR", "LinearLR", "StepLR", "OneCycleLR", "ExponentialLR")


def _light_optimizers(run):
    """``run()`` with torch's optimizers and schedules replaced by the light stand-ins, restored
    afterwards: a worker ends with its case, but a process that runs cases in turn (the tests')
    goes on."""
    replaced = [(torch.optim, name, LightOptimizer) for name in _OPTIMIZERS] + [
        (torch.optim.lr_scheduler, name, LightSchedule) for name in _SCHEDULES]
    kept = [(owner, name, _getattr(owner, name)) for owner, name, _ in replaced]
    del _BUILT[:]   # this run's optimizers only
    for owner, name, stand_in in replaced:
        _setattr(owner, name, stand_in)
    try:
        return run()
    finally:
        for owner, name, original in kept:
            _setattr(owner, name, original)


def _gradient_reached(grad):
    """Where a training step's gradient reached the logits (B, T, V): per row, the positions it
    reached, and at each the token the loss pulls up (the entry with the lowest gradient: a
    cross-entropy's gradient is the softmax minus the target's one-hot)."""
    positions, targets = [], []
    for row in grad.detach().tolist():
        reached = [(t, values) for t, values in enumerate(row) if any(v != 0.0 for v in values)]
        positions.append([t for t, _ in reached])
        targets.append([_min(_range(_len(values)), key=values.__getitem__) for _, values in reached])
    return {"positions": positions, "targets": targets}


class ObservedForwards:
    """Every outermost ``HybridTransformerLM.forward`` observed from the grader's side while in
    use (wrapped on the class, restored on exit): ``calls`` (which model, by its index in
    ``seen``; gradients on or off; the tokens, when small; with ``gradients``, where the
    training step's gradient reached the logits), and ``raised``, the exception a forward raised.
    Each parameter a model has when it runs forward gets a hook counting the gradients computed
    for it (per parameter name, the tensors a name held added up: the course's ``Module.to``
    replaces them), and each observed forward's logits one counting the gradients they received
    (``gradient_counts``): a loss backpropagated without an observed forward (through the
    blocks, or through the forward's original taken from the wrapper) reaches parameters
    uncounted."""

    def __init__(self, module, gradients=False):
        self.module, self.gradients = module, gradients
        self.calls, self.seen, self.raised = [], [], None
        self.counts, self.hooked = [], {}   # per model in seen: {parameter name: count}; id -> tensor hooked

    def index(self, model):
        return next((i for i, seen in enumerate(self.seen) if seen is model), None)

    def watch(self, model):
        """Hook the parameters of ``model`` (a model in ``seen``) not hooked yet."""
        counts = self.counts[self.index(model)]
        try:
            named = _list(model.named_parameters())
        except Exception:  # noqa: BLE001 - a model that cannot list its parameters is counted as having none
            named = []
        for name, param in named:
            if not _isinstance(param, _Tensor) or not param.requires_grad or _id(param) in self.hooked:
                continue
            self.hooked[_id(param)] = param   # kept, so that its id is not reused
            counts.setdefault(name, 0)

            def counted(grad, name=name):
                counts[name] += 1
            _register_hook(param, counted)

    def gradient_counts(self, model):
        """The gradients the model's observed logits received, and those each parameter received."""
        index = self.index(model)
        return {"logits": sum(c.get("backward", 0) for c in self.calls if c["model"] == index),
                "parameters": _dict(self.counts[index]) if index is not None else None}

    def __enter__(self):
        cls, observer, depth = self.module.HybridTransformerLM, self, [0]
        self.original = original = cls.forward

        def observed_forward(model, tokens, *args, **kwargs):
            call = None
            if depth[0] == 0:
                if observer.index(model) is None:
                    observer.seen.append(model)
                    observer.counts.append({})
                observer.watch(model)
                small = _isinstance(tokens, _Tensor) and tokens.numel() <= 4096
                call = {"model": observer.index(model), "training": _grad_enabled(),
                        "tokens": tokens.tolist() if small else None}
                observer.calls.append(call)
            depth[0] += 1
            try:
                logits = original(model, tokens, *args, **kwargs)
            except BaseException as exc:
                observer.raised = exc
                raise
            finally:
                depth[0] -= 1
            if call is not None and _isinstance(logits, _Tensor) and logits.requires_grad:
                call["backward"] = 0

                def received(grad, call=call):
                    call["backward"] += 1
                _register_hook(logits, received)
                if observer.gradients and logits.numel() <= 65536:
                    call["gradient"] = None

                    def reached(grad, call=call):
                        call["gradient"] = _gradient_reached(grad)
                    _register_hook(logits, reached)
            return logits
        _setattr(cls, "forward", observed_forward)
        return self

    def __exit__(self, *exc_info):
        _setattr(self.module.HybridTransformerLM, "forward", self.original)
        return False

    def stopped(self, exc):
        return "HybridTransformerLM.forward" if self.raised is exc else None


def case_training(module, inputs, config):
    """Exercise 2's ``train_and_compare`` on the grader's token streams (``train_ids`` and
    ``val_ids``, set as the module globals the exercise reads, with a tokenizer of the grader's
    alphabet), sizes and budget, torch's optimizers and schedules replaced by light stand-ins
    (``LightOptimizer``). Every outermost ``HybridTransformerLM.forward`` is observed
    from the grader's side (``ObservedForwards``), each model returned is described (``models``:
    its call index, block kinds, parameter count), with the counts of the models the config
    builds (``expected_parameters``) and the numbers returned (``returned``)."""
    function = _getattr(module, "train_and_compare", None)
    if function is None:
        return {"missing": True}
    return _light_optimizers(lambda: _train_and_observe(module, inputs, config, function))


def _described(module, observed, model):
    blocks = _getattr(model, "blocks", None)
    return {"index": observed.index(model), "gradients": observed.gradient_counts(model),
            "optimizers": _optimizers_of(model),
            "kinds": [_getattr(b, "kind", None) for b in blocks] if _isinstance(blocks, _list) else None,
            "parameters": _int(model.num_parameters()) if _isinstance(model, module.Module) else None}


def _train_and_observe(module, inputs, config, function):
    module.tokenizer = module.CharTokenizer(config["alphabet"])
    module.train_ids = _tensor(inputs["train_ids"], dtype=_LONG)
    module.val_ids = _tensor(inputs["val_ids"], dtype=_LONG)
    model_config, budget = config["model"], config["budget"]
    expected = {}
    for name, pattern in config["patterns"].items():
        reference = module.HybridTransformerLM(module.tokenizer.vocab_size, model_config["embedding_dim"], pattern,
                                               model_config["num_heads"], max_seq_len=budget["context"],
                                               hidden_dim=model_config["hidden_dim"])
        expected[name] = _int(reference.num_parameters())
    with ObservedForwards(module) as observed:
        try:
            result = function(_dict(model_config), _dict(budget), config["seed"])
        except Exception as exc:  # noqa: BLE001 - the function's failure is a finding, with what was observed
            return {"calls": observed.calls, "error": describe_error(exc), "raised_in": observed.stopped(exc)}
    results, models = result if _isinstance(result, (tuple, _list)) and _len(result) == 2 else (None, None)
    described = {name: _described(module, observed, model)
                 for name, model in (models.items() if _isinstance(models, _dict) else [])}
    returned = {}
    for name, entry in (results.items() if _isinstance(results, _dict) else []):
        returned[name] = {key: _numbers([entry.get(key)])[0] if _isinstance(entry, _dict) and _numbers(
            [entry.get(key)]) else None for key in ("parameters", "val_loss")}
    return {"calls": observed.calls, "models": described, "returned": returned, "expected_parameters": expected}


def case_recall_training(module, inputs, config):
    """Exercise 3's ``train_recall`` called once per layer pattern (``config["patterns"]``, in
    order) with the grader's sizes, budget and seed, torch's optimizers light as in
    ``case_training``. Every outermost forward is observed with the gradient its logits received
    (``ObservedForwards``); each model returned is described (``models``)."""
    function = _getattr(module, "train_recall", None)
    if function is None:
        return {"missing": True}

    def train_each():
        models = {}
        with ObservedForwards(module, gradients=True) as observed:
            for name, pattern in config["patterns"].items():
                try:
                    model = function(_list(pattern), _dict(config["model"]), _dict(config["budget"]), config["seed"])
                except Exception as exc:  # noqa: BLE001 - the function's failure is a finding
                    return {"calls": observed.calls, "error": describe_error(exc), "raised_in": observed.stopped(exc)}
                models[name] = _described(module, observed, model)
        return {"calls": observed.calls, "models": models}
    return _light_optimizers(train_each)


def case_recall_scoring(module, inputs, config):
    """Exercise 3's ``recall_accuracy`` on queries of the grader's (``tokens``, ``answers``,
    ``distances``) and a model whose forward answers them with the grader's logits (``logits``,
    looked up by each row's tokens, so any batching or order of rows gets the same answers):
    the trusted side scores those logits itself. ``returned``: the numbers it returned;
    ``rows_scored``: how many rows the model was asked for."""
    function = _getattr(module, "recall_accuracy", None)
    if function is None:
        return {"missing": True}
    _manual_seed(config["seed"])
    model = module.HybridTransformerLM(config["vocab_size"], config["embedding_dim"], ["full"],
                                       config["num_heads"], config["max_seq_len"])
    rows = [tuple(_int(t) for t in row) for row in inputs["tokens"].tolist()]
    answers_of = {row: logits for row, logits in zip(rows, inputs["logits"].tolist())}
    asked = [0]

    def grader_answers(tokens, *args, **kwargs):
        found = [answers_of.get(tuple(_int(t) for t in row)) for row in tokens.tolist()]
        if any(logits is None for logits in found):
            raise ValueError("the grader's model answers the grader's queries only")
        asked[0] += _len(found)
        return _tensor(found, dtype=_FLOAT32)
    model.forward = grader_answers
    try:
        result = function(model, _tensor(inputs["tokens"], dtype=_LONG), _tensor(inputs["answers"], dtype=_LONG),
                          _tensor(inputs["distances"], dtype=_LONG))
    except Exception as exc:  # noqa: BLE001 - the function's failure is a finding
        return {"error": describe_error(exc), "rows_scored": asked[0]}
    returned = None
    if _isinstance(result, _dict):
        overall = _numbers([result.get("overall_accuracy")])
        returned = {"accuracy": _numbers(result.get("accuracy")), "overall_accuracy": overall[0] if overall else None}
    return {"returned": returned, "type": _type(result).__name__, "rows_scored": asked[0]}


def _warm_optimizers(kinds):
    """For a plan with the grading run: build and step torch's AdamW and LambdaLR once, here in
    the supervisor, before any worker forks (about 1.4 s, so only then). Their first use imports
    torch._dynamo, which sets functions' ``__defaults__`` (refused by the workers' audit hook) and
    names a cache folder (found by looking for a writable one, which the read-only sandbox has
    not: an existing folder is named for that moment only, and nothing is written to it). The
    grading run's workers then train with torch's own classes, as the notebook does."""
    if "grading_run" not in kinds:
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/"
    try:
        param = torch.nn.Parameter(torch.zeros(2))
        param.grad = torch.ones(2)
        optimizer = torch.optim.AdamW([param], lr=1e-3)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    finally:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]



def case_grading_run(module, inputs, config):
    """Exercises 2 to 4 as the notebook's run cells run them in grading mode (their data, budgets,
    seeds and module globals, AdamW and its schedule), so that the figures the written answers
    are grounded on come from a run the grader observed: after each exercise function returns,
    this driver measures what it made, and the trusted side computes the figures.

    - Exercise 2: each model ``train_and_compare`` returned, described as ``case_training``
      describes it (``models``: which observed model it is, the gradients it received), evaluated
      on the held-out windows the provided ``evaluate_loss`` reads (``train.inputs``,
      ``train.<name>.logits``); each linear layer's gamma_logit (``decay.<name>.<i>``, bottom to
      top).
    - Exercise 3: each model ``train_recall`` returned, described the same way (``recall``), run
      on the notebook's evaluation rows (``recall.tokens``; the logits at the query positions,
      ``recall.<name>.logits``).
    Every outermost forward of Exercises 2 and 3 is observed (``calls``, ``recall.calls``), so
    that the training items can be judged on this run too, which student code cannot tell from
    the notebook's.
    - Exercise 4: the notebook's decay layer and inputs, stepped by the layer's own ``step`` from
      a fresh state under each decay logit; S after the token counts the notebook prints
      (``norms.<label>.<n>``).
    ``errors``: per exercise, what stopped it."""
    errors, models, recall_models = {}, {}, {}
    setup, budget = config["training"], config["training"]["budget"]
    module.TINYSTORIES_PATH = None
    module.EX2_BUDGET, module.STORY_COUNT, module.MAX_CHARS = _dict(budget), setup["stories"], setup["max_chars"]
    module.story_text = module.load_story_text(None, num_stories=setup["stories"], seed=0,
                                               max_chars=setup["max_chars"])
    module.tokenizer = module.CharTokenizer(module.story_text)
    module.story_ids = _tensor(module.tokenizer.encode(module.story_text), dtype=_LONG)
    module.split = _int(0.9 * _len(module.story_ids))
    module.train_ids, module.val_ids = module.story_ids[:module.split], module.story_ids[module.split:]
    windows, _ = module.get_batch(module.val_ids, budget["batch_size"], budget["context"],
                                  _Generator().manual_seed(setup["eval_seed"]))
    windows = _clone(windows)
    save_output("train.inputs", windows.to(dtype=_FLOAT64))
    with ObservedForwards(module) as observed:
        training_calls = observed.calls
        try:
            results, trained = module.train_and_compare(module.STORYLM_1M, _dict(budget))
            module.TRAINING_RESULTS, module.STORY_MODELS = results, trained
            models = {name: _described(module, observed, trained[name]) for name in config["patterns"]}
        except Exception as exc:  # noqa: BLE001 - the exercise's failure is a finding
            errors["training"] = describe_error(exc)
    try:
        for name in models:
            model = module.STORY_MODELS[name]
            with _no_grad():
                save_output(f"train.{name}.logits", _clone(model(windows)))
            linear = [b for b in model.blocks if _getattr(b, "kind", None) == "linear"]
            for i, block in enumerate(linear):
                save_output(f"decay.{name}.{i}", _clone(block.attn.gamma_logit.detach()))
    except Exception as exc:  # noqa: BLE001 - a model that cannot be evaluated has no figures
        errors["training"] = describe_error(exc)
    recall = config["recall"]
    module.RECALL_CONFIG, module.RECALL_BUDGET = _dict(recall["model"]), _dict(recall["budget"])
    module.RECALL_DISTANCES = _list(_range(1, module.RECALL_NUM_PAIRS + 1))
    tokens, answers, distances = module.recall_batch(recall["budget"]["eval_size"],
                                                     _Generator().manual_seed(recall["eval_seed"]))
    module.eval_tokens, module.eval_answers, module.eval_distances = tokens, answers, distances
    tokens = _clone(tokens)
    save_output("recall.tokens", tokens.to(dtype=_FLOAT64))
    trained = {}
    with ObservedForwards(module, gradients=True) as observed:   # recall_query_loss reads where the loss reached
        recall_calls = observed.calls
        try:
            for name, pattern in config["patterns"].items():
                trained[name] = module.train_recall(_list(pattern), _dict(recall["model"]), _dict(recall["budget"]),
                                                    seed=0)
                recall_models[name] = _described(module, observed, trained[name])
        except Exception as exc:  # noqa: BLE001 - the exercise's failure is a finding
            errors["recall"] = describe_error(exc)
    try:
        for name, model in trained.items():
            with _no_grad():
                save_output(f"recall.{name}.logits", _clone(model(tokens)[:, -module.RECALL_NUM_PAIRS:]))
    except Exception as exc:  # noqa: BLE001 - a model that cannot be scored has no figures
        errors["recall"] = describe_error(exc)
    norms = config["norms"]
    try:
        _manual_seed(0)
        layer = module.LinearAttention(norms["embedding_dim"], norms["num_heads"])
        x = _randn(1, norms["tokens"], norms["embedding_dim"])
        module.decay_layer, module.decay_inputs = layer, x
        with _no_grad():
            for label, logit in config["norms"]["logits"].items():
                layer.gamma_logit.fill_(logit)
                state = None
                for t in _range(norms["tokens"]):
                    _, state = layer.step(x[:, t], state)
                    if t + 1 in norms["positions"]:
                        save_output(f"norms.{label}.{t + 1}", _clone(state[0]))
    except Exception as exc:  # noqa: BLE001 - the exercise's failure is a finding
        errors["norms"] = describe_error(exc)
    return {"errors": errors, "models": models, "calls": training_calls,
            "recall": {"models": recall_models, "calls": recall_calls},
            "decay": _run_cell_decays(module, norms, trained_models=module.__dict__.get("STORY_MODELS"))}


def _run_cell_decays(module, norms, trained_models):
    """Exercise 4's two functions as its run cell calls them (``decay_layer``, ``decay_inputs``,
    the notebook's logits; the Exercise 2 models): what each returned, the norms at the positions
    the notebook prints, or why it raised."""
    found = {}
    try:
        returned = module.state_norms(module.decay_layer, module.decay_inputs, _dict(norms["logits"]))
        found["state_norms"] = {label: _numbers([row[n - 1] for n in norms["positions"]])
                                if _isinstance(row := returned.get(label), (_list, tuple)) and
                                _len(row) >= norms["positions"][-1] else None for label in norms["logits"]} \
            if _isinstance(returned, _dict) else None
    except Exception as exc:  # noqa: BLE001 - the function's failure is a finding
        found["state_norms_error"] = describe_error(exc)
    if trained_models is not None:
        try:
            returned = module.learned_decays(trained_models)
            found["learned_decays"] = {name: [_numbers(row) for row in layers]
                                       if _isinstance(layers := returned.get(name), (_list, tuple)) else None
                                       for name in trained_models} if _isinstance(returned, _dict) else None
        except Exception as exc:  # noqa: BLE001 - the function's failure is a finding
            found["learned_decays_error"] = describe_error(exc)
    return found


HANDLERS = {"forward": case_forward, "steps": case_steps, "state_growth": case_state_growth,
            "state_contract": case_state_contract, "grader_state": case_grader_state,
            "hybrid": case_hybrid, "benchmark": case_benchmark,
            "decay_norms": case_decay_norms, "learned_decays": case_learned_decays, "training": case_training,
            "recall_training": case_recall_training, "recall_scoring": case_recall_scoring,
            "grading_run": case_grading_run}
PREPARE = _warm_optimizers
