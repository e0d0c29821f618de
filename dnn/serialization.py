"""The model file format (no pickle), its atomic write and its checked read.

Layout of a file (all integers little-endian):

    offset 0   magic        8 bytes  b"DNNMODEL"
    8          version      u32      2 (version 1 files, without "training", are read too)
    12         header size  u32      H
    16         header crc   u32      CRC-32 of the header bytes
    20         header       H bytes  UTF-8 JSON (below)
    ...        zero padding to a multiple of 64
    data       the arrays, each C-ordered little-endian at a 64-byte-aligned
               offset from the start of the data; the file ends with the last array

    header = {"format": "dnn.model", "version": 2,
              "model": {"class": "Sequential", "name", "dtype", "loss", "seed",
                        "layers": [layer.get_config(), ...], "loss_scale": {...} or null},
              "optimizer": optimizer.get_config(),
              "optimizer_params": names of the weights whose state "optimizer/param<i>/..."
                                  holds, i their position here (frozen layers' too; a file
                                  without it holds the trained parameters' in model order),
              "training": {"epochs_trained": int, "random": [seed, stream] of dmath.random,
                           "position": null, or {"epoch", "batch", "batch_size", "samples"} when saved
                           inside an epoch (after that many batches of it)},
              "data_bytes": total bytes after the header,
              "arrays": [{"name", "dtype", "shape", "offset", "nbytes", "crc32"}, ...]}

Array names: "weights/<layer>/<weight>" in get_weights order, then
"optimizer/<key>" (state and counters), "loss_scale/<key>", "state/<layer>/<key>"
(a layer's counters, Layer.get_state) and, inside an epoch, "metrics/<key>"
(the epoch's loss and correct sums so far).

A checkpoint holds global arrays: the saving run gathers every matrix to the
master, the loading run writes each into the layout it chose itself (at its
own worker count), so resharding is the scatter of an ordinary load. A file
is a complete resume point: with the same data, a loaded model's
fit(..., initial_epoch=k) repeats the uninterrupted run's steps (the same
batches, dropout masks, augmentations, optimizer moments and schedule).

Before a model is built from a file its weights' shapes are derived from the
architecture without allocating anything (Layer.weight_shapes) and compared
with the arrays the file holds, so a file with valid checksums that
describes an impossible model (units=10**10) raises ModelFileError instead
of trying to allocate it.

Writing goes to a temporary file in the same directory, is fsync'ed, then
renamed over the destination (os.replace) and the directory fsync'ed: a
crash leaves either the old file or the new one, never a mix. The new file
keeps the permission bits of the one it replaces (a read-only checkpoint
stays read-only); a new path gets 0o666 less the umask (data.files).
Reading checks the magic, version, header CRC, JSON fields, that the file is
exactly as long as declared, every array's bounds, size and CRC, that no two
arrays share a name or bytes, and that the arrays match the model they
describe, with none that it does not read (the names above); any mismatch
raises ModelFileError. Nothing is read before the size that the part read so
far declares is checked against the file's (a sparse 64 GiB file is refused
by its header, not allocated). The training state's values are checked too
(optimizer state of its parameters' exact shapes, finite, Adam's b^t in
[0, 1]; counters whole numbers >= 0; a mid-epoch checkpoint's sums against
its position), all before anything is written into the model: a refused file
leaves the model (load_weights) as it was.
"""
import json
import math
import os
import struct
import zlib

import numpy as np

import dmath

from dmath.ops.files import open_regular

from .data.files import checked_path, write_atomically
from .errors import ConfigError, DNNError, ModelFileError

MAGIC = b"DNNMODEL"
VERSION = 2
_READABLE = (1, 2)
ALIGN = 64
_PREFIX = struct.Struct("<8sIII")          # magic, version, header size, header crc
_DTYPES = ("float16", "float32", "float64", "int64")
_MAX_HEADER = 64 << 20


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def write_file(path, header, arrays):
    """Write `header` (a JSON-able dict) and named numpy arrays to `path` atomically."""
    entries, blobs, offset = [], [], 0
    for name, a in arrays:
        a = np.asarray(a, order="C")        # (ascontiguousarray would make a 0-d array 1-d)
        if a.dtype.name not in _DTYPES:
            raise DNNError(f"cannot save array {name!r} of dtype {a.dtype}")
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        offset = _align(offset)
        entries.append({"name": name, "dtype": a.dtype.name, "shape": list(a.shape), "offset": offset,
                        "nbytes": len(raw), "crc32": zlib.crc32(raw)})
        blobs.append((offset, raw))
        offset += len(raw)
    header = dict(header, arrays=entries, data_bytes=offset)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    prefix = _PREFIX.pack(MAGIC, VERSION, len(head), zlib.crc32(head))
    data_start = _align(len(prefix) + len(head))
    path = model_path(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ModelFileError(f"{path!r} cannot be written: its directory {directory!r} does not exist")
    chunks = [prefix, head, b"\0" * (data_start - len(prefix) - len(head))]
    pos = 0
    for off, raw in blobs:
        chunks += [b"\0" * (off - pos), raw]
        pos = off + len(raw)
    try:
        write_atomically(path, chunks)
    except OSError as exc:
        raise ModelFileError(f"{path!r} cannot be written ({exc})") from exc


def model_path(path):
    """`path` as a str: a str or an os.PathLike of one; ConfigError otherwise (None, bytes, ...)."""
    return checked_path(path, "a model file")


def read_file(path):
    """(header dict, {name: numpy array}) of a model file, checked; raises ModelFileError.

    Nothing is read before it is checked against the file's size: the prefix first, then the
    header it declares (at most _MAX_HEADER bytes, inside the file), then, once the header says the
    file is exactly as long as it is and its arrays lie apart inside the data, each array. A file
    read whole first made a sparse 64 GiB file a 64 GiB allocation (a raw MemoryError, or the
    process killed); now what is read is what the header accounts for, at most the file's size."""
    path = model_path(path)
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            header, data_start = _read_header(f, size, path)
            entries = _entries(header, size - data_start, path)
            return header, {e["name"]: _read_array(f, data_start, e, path) for e in entries}
    except ModelFileError:           # (an OSError too)
        raise
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path!r}: {exc}") from exc


def _read_exactly(f, offset, n, path, what):
    """n bytes of `f` at `offset` (a bytearray); ModelFileError when the file ends first (it was
    shorter than its size said when opened: changed while read), or the bytes do not fit in memory."""
    try:
        buf = bytearray(n)
    except MemoryError as exc:
        raise ModelFileError(f"{path!r}: {what} of {n} bytes does not fit in memory") from exc
    f.seek(offset)
    view, got = memoryview(buf), 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise ModelFileError(f"{path!r} is truncated: it ends inside {what} (it changed while it was read)")
        got += k
    return buf


def _read_header(f, size, path):
    """(the header dict, the offset of the data) of an open model file of `size` bytes, checked."""
    if size < _PREFIX.size:
        raise ModelFileError(f"{path!r} is not a dnn model file: {size} bytes, shorter than the prefix")
    magic, version, hsize, hcrc = _PREFIX.unpack(_read_exactly(f, 0, _PREFIX.size, path, "the prefix"))
    if magic != MAGIC:
        raise ModelFileError(f"{path!r} is not a dnn model file (magic {magic!r}, expected {MAGIC!r})")
    if version not in _READABLE:
        raise ModelFileError(f"{path!r} has format version {version}; this dnn reads versions {_READABLE}")
    if hsize > _MAX_HEADER or _PREFIX.size + hsize > size:
        raise ModelFileError(f"{path!r} is truncated: its header of {hsize} bytes ends past the file "
                             f"({size} bytes)")
    head = bytes(_read_exactly(f, _PREFIX.size, hsize, path, "the header"))
    if zlib.crc32(head) != hcrc:
        raise ModelFileError(f"{path!r} is corrupt: the header's checksum does not match")
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path!r} is corrupt: its header is not valid JSON ({exc})") from exc
    except ValueError as exc:           # e.g. an integer of more digits than Python converts
        raise ModelFileError(f"{path!r} is corrupt: its header holds a value that cannot be read ({exc})") from exc
    except RecursionError as exc:        # valid JSON nested deeper than the parser's recursion limit
        raise ModelFileError(f"{path!r} is corrupt: its header nests deeper than any model's") from exc
    if not isinstance(header, dict) or header.get("format") != "dnn.model":
        raise ModelFileError(f"{path!r}: the header does not describe a dnn model")
    data_start = _align(_PREFIX.size + hsize)
    data_bytes = _field(header, "data_bytes", int, path)
    if size != data_start + data_bytes:
        what = "truncated" if size < data_start + data_bytes else "longer than declared"
        raise ModelFileError(f"{path!r} is {what}: {size} bytes, expected {data_start + data_bytes}")
    return header, data_start


def _field(d, key, kind, path):
    v = d.get(key)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise ModelFileError(f"{path!r}: the header's {key!r} is missing or not a {kind.__name__}")
    return v


def _entries(header, size, path):
    """The header's array entries, checked before any array is read: well formed, each name once (a
    second entry of a name replaced the first's array, a weight among them, without a word), inside
    the `size` bytes of data and apart from one another (entries sharing bytes each became an array,
    so a small file could ask for any amount of memory; write_file lays them one after another)."""
    entries, names = [], set()
    for e in _field(header, "arrays", list, path):
        _check_entry(e, size, path)
        if e["name"] in names:
            raise ModelFileError(f"{path!r}: the file holds two arrays named {e['name']!r}; each name is "
                                 f"one array's")
        names.add(e["name"])
        entries.append(e)
    end, last = 0, None
    for e in sorted((e for e in entries if e["nbytes"]), key=lambda e: e["offset"]):
        if e["offset"] < end:
            raise ModelFileError(f"{path!r}: array {e['name']!r} overlaps array {last!r} (its bytes start at "
                                 f"{e['offset']}, before that one's end at {end}); each array has bytes of its own")
        end, last = e["offset"] + e["nbytes"], e["name"]
    return entries


def _check_entry(e, size, path):
    if not isinstance(e, dict):
        raise ModelFileError(f"{path!r}: an array entry is not an object")
    name = e.get("name")
    dtype, shape = e.get("dtype"), e.get("shape")
    off, nbytes, crc = e.get("offset"), e.get("nbytes"), e.get("crc32")
    if not isinstance(name, str) or dtype not in _DTYPES or not isinstance(shape, list) \
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape) \
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (off, nbytes, crc)):
        raise ModelFileError(f"{path!r}: malformed array entry {e!r}")
    if nbytes != math.prod(shape) * np.dtype(dtype).itemsize:      # Python ints: an int64 product wraps
        raise ModelFileError(f"{path!r}: array {name!r} declares {nbytes} bytes for shape {shape} {dtype}")
    if off + nbytes > size:
        raise ModelFileError(f"{path!r}: array {name!r} lies past the end of the data")


def _read_array(f, start, e, path):
    name, dtype, shape = e["name"], np.dtype(e["dtype"]), e["shape"]
    raw = _read_exactly(f, start + e["offset"], e["nbytes"], path, f"array {name!r}")
    if zlib.crc32(raw) != e["crc32"]:
        raise ModelFileError(f"{path!r} is corrupt: the checksum of array {name!r} does not match")
    try:
        # (on a little-endian host the view is the array: no copy of its bytes)
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
    except ValueError as exc:       # e.g. an empty array with a dimension past NumPy's largest
        raise ModelFileError(f"{path!r}: array {name!r} has the impossible shape {shape} ({exc})") from exc


# ---- models --------------------------------------------------------------------------------------
def save_model(model, path):
    """Write `model` (architecture, weights, optimizer and loss-scale state) to `path`."""
    path = model_path(path)          # before any weight is gathered
    # a schedule that dnn.load could not rebuild is refused before anything is written
    from .optim import schedules
    schedules.check_saveable(model.optimizer.schedule)
    arrays = [(f"weights/{w.name}", w.numpy()) for layer in model.layers for w in layer.weights]
    # the state of every parameter that has one, frozen layers' too (a frozen layer keeps its momentum
    # for when it is trained again), named in the header: positions alone shift when a layer is frozen
    stateful = [w for layer in model.layers for w in layer.weights
                if w.trainable and model.optimizer.has_state(w.var)]
    arrays += [(f"optimizer/{k}", np.asarray(v))
               for k, v in model.optimizer.get_state([w.var for w in stateful]).items()]
    if model.loss_scale is not None:
        arrays += [("loss_scale/scale", model.loss_scale.scale.to_numpy()),
                   ("loss_scale/good_steps", model.loss_scale.good_steps.to_numpy())]
    arrays += [(f"state/{layer.name}/{k}", v) for layer in model.layers for k, v in layer.get_state().items()]
    training = {"epochs_trained": model.epochs_trained, "random": list(dmath.random.get_state()), "position": None}
    if model.position is not None:
        epoch, batch, batch_size, samples = model.position
        # samples: the epoch's data size, which a resume must match (files before it lack it)
        training["position"] = {"epoch": epoch, "batch": batch, "batch_size": batch_size, "samples": samples}
        arrays += [(f"metrics/{k}", v) for k, v in model.train_metrics.get_state().items()]
    header = {"format": "dnn.model", "version": VERSION, "model": model.get_config(),
              "optimizer": model.optimizer.get_config(), "optimizer_params": [w.name for w in stateful],
              "training": training}
    write_file(path, header, arrays)


def load_model(path):
    """A new Model (or Sequential) from a file written by `save_model`; raises ModelFileError on any mismatch."""
    from . import optim
    from .model import Model
    header, arrays = read_file(path)
    try:
        check_weight_shapes(header["model"], arrays, path)
        model = Model.from_config(header["model"], optimizer=optim.get(header.get("optimizer")))
    except ConfigError as exc:
        raise ModelFileError(f"{os.fspath(path)!r}: the model described in the file cannot be built: {exc}") from exc
    except KeyError as exc:
        raise ModelFileError(f"{os.fspath(path)!r}: the model described in the file lacks the field "
                             f"{exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelFileError(f"{os.fspath(path)!r}: the model described in the file is malformed "
                             f"({type(exc).__name__}: {exc})") from exc
    load_state(model, header, arrays, path)
    random_state = (header.get("training") or {}).get("random")
    if random_state is not None:
        try:
            dmath.random.set_state(random_state)
        except dmath.DMathError as exc:
            raise ModelFileError(f"{os.fspath(path)!r}: bad random state: {exc}") from exc
    return model


def check_weight_shapes(config, arrays, path):
    """Raise ModelFileError unless the weights the architecture `config` would create are exactly
    the file's weight arrays (names and shapes), without creating anything."""
    from .functional import config_weight_shapes
    if not isinstance(config, dict) or not (isinstance(config.get("graph"), dict) or
                                            (isinstance(config.get("layers"), list) and config["layers"])):
        raise ModelFileError(f"{os.fspath(path)!r}: the header's model has no layers")
    try:
        expected = [(f"weights/{name}", s) for name, s in config_weight_shapes(config)]
    except ConfigError as exc:
        raise ModelFileError(f"{os.fspath(path)!r}: {exc}") from exc
    found = [(k, tuple(a.shape)) for k, a in arrays.items() if k.startswith("weights/")]
    if found != expected:
        raise ModelFileError(f"{os.fspath(path)!r}: the architecture in the file needs weights {expected}, "
                             f"the file holds {found}")


def load_state(model, header, arrays, path):
    """Write the file's weights, optimizer state, layers' counters, training position and loss scale
    into `model`. Every one of them is checked before the first is written, so a refused file
    (ModelFileError) leaves the model as it was, as load_state_dict does: the weights were written
    first, and a file refused for its optimizer state, a counter or its metric sums left the model
    holding the file's weights with its own training state."""
    path = os.fspath(path)
    expected = [(f"weights/{w.name}", w.public_shape) for layer in model.layers for w in layer.weights]
    found = [k for k in arrays if k.startswith("weights/")]
    if found != [k for k, _ in expected]:
        raise ModelFileError(f"{path!r}: the file's weights {found} do not match the model's "
                             f"{[k for k, _ in expected]}")
    for key, shape in expected:
        a = arrays[key]
        if tuple(a.shape) != tuple(shape):
            raise ModelFileError(f"{path!r}: weight {key!r} has shape {tuple(a.shape)} in the file, "
                                 f"the model expects {tuple(shape)}")
        # a NaN or an infinity is no weight a model can use (a diverged run's, or a damaged file's):
        # refused as load_state_dict refuses it, before predict or fit turns it into NaN outputs
        if a.size and a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ModelFileError(f"{path!r}: weight {key!r} holds NaN or infinity "
                                 f"({int(np.count_nonzero(~np.isfinite(a)))} of {a.size} values)")
    _check_accounted_for(model, header, arrays, path)
    weights, i = [], 0
    for layer in model.layers:        # the weights' own checks (a value past the dtype, a floor)
        n = len(layer.weights)
        try:
            weights.append((layer, layer.checked_weights([arrays[k] for k, _ in expected[i:i + n]])))
        except DNNError as exc:
            raise ModelFileError(f"{path!r}: {exc}") from exc
        i += n
    state = {k[len("optimizer/"):]: v for k, v in arrays.items() if k.startswith("optimizer/")}
    params = _stateful_params(model, header, path)
    _check_optimizer_state(model, header, state, path, params)
    optimizer_state = None
    if state:
        try:
            optimizer_state = model.optimizer.check_state(params, state)
        except DNNError as exc:
            raise ModelFileError(f"{path!r}: the optimizer state in the file cannot be restored: {exc}") from exc
    layer_states = _checked_layer_states(model, arrays, path)
    training = _checked_training(model, header.get("training"), arrays, path)
    loss_scale = _checked_loss_scale(model, arrays, path)
    # ---- every check passed: the writes
    for layer, checked in weights:
        layer.write_checked(checked)
    if optimizer_state is not None:
        model.optimizer.write_state(params, optimizer_state)
    for layer, checked in layer_states:
        layer.set_state(checked)
    if training is not None:
        model.epochs_trained, model.resume = training
    if loss_scale is not None:
        model.loss_scale.setup()
        model.loss_scale.scale.assign(np.full((1, 1), loss_scale[0], dtype=np.float32))
        model.loss_scale.good_steps.assign(np.full((1, 1), loss_scale[1], dtype=np.float32))


def _checked_layer_states(model, arrays, path):
    """[(layer, its counters checked)] of the layers whose counters ("state/<layer>/<key>") the file
    holds, changing nothing; ModelFileError naming the array that a layer refuses (NaN, infinity,
    a fraction, several values). A layer without a check_state of its own gets its arrays as they
    are: its set_state checks them as it writes them."""
    out = []
    for layer in model.layers:
        prefix = f"state/{layer.name}/"
        mine = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        if not mine:
            continue
        check = getattr(layer, "check_state", None)
        try:
            out.append((layer, check(mine) if check is not None else mine))
        except DNNError as exc:
            raise ModelFileError(f"{path!r}: the layer state {sorted(prefix + k for k in mine)} in the file "
                                 f"cannot be restored: {exc}") from exc
    return out


def _checked_loss_scale(model, arrays, path):
    """(scale, good steps) of the file for a model with a loss scale (None otherwise, or when the
    file has none): a positive finite scale and a whole count, each one value."""
    if model.loss_scale is None or "loss_scale/scale" not in arrays:
        return None
    scale, good = (_one_value(arrays, f"loss_scale/{k}", path) for k in ("scale", "good_steps"))
    if not (np.isfinite(scale) and scale > 0 and np.isfinite(good) and good >= 0 and good == int(good)):
        raise ModelFileError(f"{path!r}: the loss scale {scale} and its good steps {good} must be a positive "
                             f"finite scale and a count")
    return scale, good


def _check_accounted_for(model, header, arrays, path):
    """ModelFileError naming the arrays of the file that nothing reads: each array is a weight (the
    caller checks those), optimizer state (_check_optimizer_state checks it against the optimizer),
    the loss scale of a float16 model, a counter of one of the model's layers (the names its
    get_state gives), or a metric sum of a checkpoint saved inside an epoch. Anything else was
    ignored, so a damaged or crafted file loaded as if whole. Every version wrote only these (the
    layers' counters and the metrics from version 2 on), so older files pass."""
    known = {f"state/{layer.name}/{k}" for layer in model.layers for k in layer.get_state()}
    config = header.get("model")
    if model.loss_scale is not None or (isinstance(config, dict) and config.get("dtype") == "float16"):
        # (a float16 file's weights may be loaded into a float32 model, which has no use for its scale)
        known |= {"loss_scale/scale", "loss_scale/good_steps"}
    training = header.get("training")
    if isinstance(training, dict) and training.get("position") is not None:
        known |= {"metrics/loss", "metrics/correct", "metrics/samples"}
    unexpected = [k for k in arrays if not k.startswith(("weights/", "optimizer/")) and k not in known]
    if unexpected:
        counters = sorted(k for k in known if k.startswith("state/"))
        raise ModelFileError(f"{path!r} holds arrays its header does not account for: {unexpected}; a model file "
                             f"holds only its model's weights/ and optimizer/ arrays, the layers' counters "
                             f"({counters or 'none in this model'}), a float16 model's loss_scale/ and a "
                             f"mid-epoch checkpoint's metrics/")


def _stateful_params(model, header, path):
    """The parameters whose optimizer state the file holds, in its order: those its header names
    (frozen layers' among them), or, in a file that names none (written before the names were kept),
    the model's trained parameters."""
    names = header.get("optimizer_params")
    if names is None:
        return model.params
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ModelFileError(f"{path!r}: the header's optimizer_params must be a list of distinct weight names")
    weights = {w.name: w for layer in model.layers for w in layer.weights if w.trainable}
    unknown = [n for n in names if n not in weights]
    if unknown:
        raise ModelFileError(f"{path!r}: the file holds optimizer state of {unknown}, which are not trainable "
                             f"weights of the model")
    return [weights[n].var for n in names]


def _check_optimizer_state(model, header, state, path, params):
    """ModelFileError when the file's optimizer state is not one the model's optimizer can continue
    from: another optimizer's (an Adam file into an SGD model would keep Adam's step count and
    start the momentum from zero), or state arrays it does not keep or lacks (SGD with and without
    momentum). Load such a file with dnn.load, which builds the file's own optimizer."""
    opt = model.optimizer
    mine = type(opt).__name__
    saved = header.get("optimizer")
    theirs = saved.get("name") if isinstance(saved, dict) else None
    if theirs is not None and theirs != mine:
        raise ModelFileError(f"{path!r} holds the training state of the optimizer {theirs}, but this model's "
                             f"optimizer is {mine}: give the model a {theirs} optimizer (or use dnn.load(path), "
                             f"which builds the file's) to continue that run")
    per_param = {f"param{i}/{name}" for i in range(len(params)) for name in opt.state_names}
    scalars = {f"scalars/{p.dtype}/{name}" for p in params for name in opt.new_scalars(p.dtype)}
    unknown = sorted(set(state) - per_param - scalars - {"iterations"})
    # a file saved before any step holds no per-parameter state; one saved after holds all of it
    stepped = np.any(np.asarray(state.get("iterations", 0)) > 0) or any(k.startswith("param") for k in state)
    missing = sorted(per_param - set(state)) if stepped else []
    if unknown or missing:
        raise ModelFileError(f"{path!r}: the file's {theirs or 'optimizer'} state does not fit this model's "
                             f"{mine} ({opt.get_config()}): "
                             + "; ".join(f"{what} {keys}" for what, keys in
                                         (("it holds state this optimizer does not keep:", unknown),
                                          ("it lacks", missing)) if keys))


def _one_value(arrays, key, path):
    """The one number of array `key` as a float; ModelFileError when it is missing or not one value."""
    a = arrays.get(key)
    if a is None or a.size != 1:
        raise ModelFileError(f"{path!r}: {key!r} must be one value, "
                             f"{'it is missing' if a is None else f'found shape {a.shape}'}")
    return float(a.reshape(-1)[0])


def _checked_training(model, training, arrays, path):
    """(epochs trained, resume point or None) of the file's "training", checked, changing nothing;
    None for a version 1 file, which has none (the model keeps its own)."""
    if training is None:
        return None
    if not isinstance(training, dict):
        raise ModelFileError(f"{path!r}: the header's 'training' is not an object")
    epochs = _count(training, "epochs_trained", path)
    pos = training.get("position")
    if pos is None:
        return epochs, None
    if not isinstance(pos, dict):
        raise ModelFileError(f"{path!r}: the header's training position is not an object")
    resume = {k: _count(pos, k, path) for k in ("epoch", "batch", "batch_size")}
    resume["data_samples"] = _count(pos, "samples", path) if "samples" in pos else None
    metrics = {k[len("metrics/"):]: v for k, v in arrays.items() if k.startswith("metrics/")}
    if sorted(metrics) != ["correct", "loss", "samples"] or any(v.size != 1 for v in metrics.values()):
        raise ModelFileError(f"{path!r}: a checkpoint inside an epoch needs the metrics loss, correct and "
                             f"samples, one value each; found {sorted(metrics)}")
    resume["metrics"] = _checked_metrics(model, resume, metrics, path)
    return epochs, resume


def _checked_metrics(model, resume, metrics, path):
    """The epoch's sums so far of a checkpoint saved inside it, checked against its position. fit
    counts `samples` as the sizes of the batches done: `batch` batches of `batch_size`, the last of
    them smaller when it ended a ragged epoch, so (batch - 1) * batch_size < samples <= batch *
    batch_size. `correct` lies in [0, samples], a whole count for a categorical accuracy (a binary
    one adds each sample's fraction of right outputs, rounded in float32: a hair of slack), and the
    loss sum is finite. Only the size was checked: correct = 1e6 resumed an epoch at an accuracy
    of 31250, and samples = NaN passed the load to fail inside fit."""
    batch, size = resume["batch"], resume["batch_size"]
    samples, correct, loss = (float(metrics[k].reshape(-1)[0]) for k in ("samples", "correct", "loss"))
    lo, hi = max(batch - 1, 0) * size, batch * size
    if not (math.isfinite(samples) and samples == math.floor(samples)
            and (lo < samples <= hi if batch else samples == 0)):
        raise ModelFileError(f"{path!r}: 'metrics/samples' must count the samples of the batches done ({batch} of "
                             f"batch_size {size}, the last possibly smaller: a whole number in ({lo}, {hi}]), "
                             f"got {samples!r}")
    categorical = model.loss.accuracy == "categorical"
    top = samples if categorical else samples * (1 + 1e-3)
    if not (math.isfinite(correct) and 0 <= correct <= top and (not categorical or correct == math.floor(correct))):
        raise ModelFileError(f"{path!r}: 'metrics/correct' must be a {'whole ' if categorical else ''}number of "
                             f"correct predictions in [0, {samples:g}] (the samples so far), "
                             f"got {correct!r}")
    if not math.isfinite(loss):
        raise ModelFileError(f"{path!r}: 'metrics/loss' (the epoch's loss sum so far) must be finite, "
                             f"got {loss!r}")
    return {"loss": np.array(loss), "correct": np.array(correct), "samples": np.array(int(samples), dtype=np.int64)}


#: the largest training count a file may hold: epochs and batches feed the data order's keys, which
#: are exact integers below 2**53 (a count of 10**30 loaded, then failed inside fit)
_COUNT_MAX = 2 ** 53 - 1


def _count(d, key, path):
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _COUNT_MAX:
        raise ModelFileError(f"{path!r}: the header's training {key!r} must be an integer in [0, 2**53), "
                             f"got {v!r}")
    return v
