"""A model's weights keyed by PyTorch's names: `model.state_dict()` and `model.load_state_dict(mapping)`.

A layer named as a PyTorch module ('conv1', 'layer1.0.bn1', 'fc': the zoo in
dnn.models names every layer so) holds the entries that module holds in a
PyTorch state dict, with NumPy arrays as values:

    Conv2D     <name>.weight (K, C/groups, kh, kw), <name>.bias (K,)
    Dense      <name>.weight (out, in): the transpose of the layer's (in, out) kernel, <name>.bias
    BatchNorm  <name>.weight (gamma), .bias (beta), .running_mean, .running_var and
               .num_batches_tracked (an int64 scalar: the training steps that updated the
               running statistics, counted as PyTorch counts them)

Weights of any other layer are keyed <layer name>.<weight name>. Loading checks
every key and shape before it writes anything: a missing or unexpected key or
a shape that differs raises, and the model is left as it was.
"""
import numpy as np

from .errors import ConfigError, ShapeError

_TORCH_NAMES = {"Conv2D": {"kernel": "weight", "bias": "bias"},
                "Dense": {"kernel": "weight", "bias": "bias"},
                "BatchNorm": {"gamma": "weight", "beta": "bias", "running_mean": "running_mean",
                              "running_var": "running_var"}}


def _entries(layer):
    """[(key, weight or None for num_batches_tracked, transposed)] of one layer."""
    names = _TORCH_NAMES.get(type(layer).__name__, {})
    out = []
    for w in layer.weights:
        short = w.name.split("/")[-1]
        out.append((f"{layer.name}.{names.get(short, short)}", w, type(layer).__name__ == "Dense"
                    and short == "kernel"))
    if hasattr(layer, "batches_tracked"):
        out.append((f"{layer.name}.num_batches_tracked", None, False))
    return out


def state_dict(model):
    """{PyTorch name: numpy array} of every weight and buffer of `model` (see the module)."""
    out = {}
    for layer in model.layers:
        for key, w, transposed in _entries(layer):
            if w is None:
                out[key] = np.array(layer.batches_tracked, dtype=np.int64)
            else:
                a = w.numpy()
                out[key] = np.ascontiguousarray(a.T) if transposed else a
    return out


def _array(value, key):
    """`value` as a NumPy array (a torch tensor through its numpy(); detached from autograd), or a
    ShapeError saying why it is not one (a ragged list, a dtype NumPy lacks such as bfloat16)."""
    try:
        if hasattr(value, "detach") and hasattr(value, "cpu"):       # a torch tensor, never imported here
            value = value.detach().cpu().numpy()
        a = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ShapeError(f"load_state_dict: {key} is not an array of numbers ({type(value).__name__}: {exc})") from exc
    if a.dtype == object:
        raise ShapeError(f"load_state_dict: {key} is not an array of numbers (it holds Python objects)")
    return a


def load_state_dict(model, mapping):
    """Write `mapping` ({PyTorch name: array}, e.g. a PyTorch model's state_dict() whose tensors
    NumPy can read) into `model`'s weights, in place. Every key and value is checked first: a
    missing or unexpected key raises ConfigError; a shape mismatch, a value that is not an array
    of finite numbers or does not fit the weight's dtype, ShapeError; a value the layer refuses (a
    BatchNorm's negative running variance), ConfigError; and then nothing changes."""
    if not hasattr(mapping, "keys"):
        raise ConfigError(f"load_state_dict takes a mapping of names to arrays, got {type(mapping).__name__}")
    plan = [(layer, _entries(layer)) for layer in model.layers]
    expected = [key for _, entries in plan for key, _, _ in entries]
    missing = [k for k in expected if k not in mapping]
    # (ordered by their text: keys of mixed types, 7 and 'zzz', raised TypeError in the sort)
    unexpected = sorted(set(mapping) - set(expected), key=repr)
    if missing or unexpected:
        raise ConfigError("load_state_dict: the names do not match the model's"
                          + (f"; missing keys: {missing}" if missing else "")
                          + (f"; unexpected keys: {unexpected}" if unexpected else ""))
    writes = []
    for layer, entries in plan:
        arrays, tracked = [], None
        for key, w, transposed in entries:
            a = _array(mapping[key], key)
            if w is None:
                # a scalar, as torchvision's (shape ()): a (1, 1) array is another model's, not this entry
                if a.shape != () or a.dtype.kind not in "fiu" or not np.isfinite(a).all() or a.reshape(-1)[0] < 0 \
                        or a.reshape(-1)[0] != int(a.reshape(-1)[0]) or a.reshape(-1)[0] >= 2 ** 63:
                    raise ShapeError(f"load_state_dict: {key} must be one non-negative integer of shape () (a "
                                     f"scalar, as PyTorch's), got {a!r}")
                tracked = int(a.reshape(-1)[0])
                continue
            want = w.public_shape[::-1] if transposed else w.public_shape
            if a.shape != tuple(want):
                raise ShapeError(f"load_state_dict: {key} has shape {a.shape}, the model's is {tuple(want)}")
            if a.dtype.kind not in "fiu":
                raise ShapeError(f"load_state_dict: {key} must hold numbers, got dtype {a.dtype}")
            if a.size and not np.isfinite(a).all():
                raise ShapeError(f"load_state_dict: {key} holds NaN or infinity")
            top = float(np.finfo(w.value.dtype).max)
            if a.size and float(np.abs(a).max()) > top:
                raise ShapeError(f"load_state_dict: {key} holds {float(np.abs(a).max()):g}, past the largest "
                                 f"{w.value.dtype} ({top:g})")
            arrays.append(a.T if transposed else a)
        # the layer's own checks (a BatchNorm's running variance >= 0) before the first write too
        writes.append((layer, layer.checked_weights(arrays) if arrays else arrays, tracked))
    for layer, arrays, tracked in writes:
        if arrays:
            layer.write_checked(arrays)
        if tracked is not None:
            layer.batches_tracked = tracked
