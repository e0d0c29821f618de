"""JPEG files decoded on the GPU through nvImageCodec (NVIDIA's nvJPEG behind a batched Python API), for the
host-batch place 'device_decode' (dmath/ops/gpu_decode.py).

Optional: the `gpu-images` extra installs `nvidia-nvimgcodec-cu12[nvjpeg]`; on CUDA 13 install
`nvidia-nvimgcodec-cu13[nvjpeg]` (its nvJPEG wheel is `nvidia-nvjpeg`). `status()` says whether
decoding works on this worker's GPU and, when not, why.

Loading: nvImageCodec opens libnvjpeg by its soname (libnvjpeg.so.<CUDA major>) when the module is
imported. Wheels installed into a directory on PYTHONPATH (`pip install --target`) put nvJPEG under
`nvidia/nvjpeg/lib` (CUDA 12) or `nvidia/cu13/lib` (CUDA 13), where the dynamic loader does not look;
so before the import `preload_nvjpeg` finds libnvjpeg.so* under the `nvidia` directories on sys.path
and loads it with RTLD_GLOBAL: the loader's later open by soname finds it already loaded.

Decoding: one `BatchDecoder` per device and process decodes a batch in one call, on a CUDA stream of
its own, and waits for it there (the caller is a background thread of the host-batch pipeline, so the
decoding overlaps the step). Only the GPU backends are enabled (the hardware JPEG engine where the GPU
has one, then the CUDA decoder), with libjpeg's "fancy" chroma upsampling, without the EXIF
rotation (Pillow does not apply it either) and to 8-bit RGB: a file those cannot decode comes back as
None and the caller decodes it on the host.
"""
import base64
import ctypes
import glob
import os
import re
import sys
import threading

from .. import backend

#: what to install, for the messages of status()
INSTALL = ("pip install 'nvidia-nvimgcodec-cu12[nvjpeg]' (the gpu-images extra; with CUDA 13: "
           "'nvidia-nvimgcodec-cu13[nvjpeg]')")
#: libjpeg-turbo's chroma upsampling (what Pillow and simplejpeg decode with) instead of nvJPEG's nearest
OPTIONS = ":fancy_upsampling=1"
#: nvImageCodec's backends, in order of preference: the hardware JPEG engine where the GPU has one, the
#: CUDA decoder, the hybrid one (Huffman on the CPU, the rest in CUDA kernels)
KINDS = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU")
#: nvImageCodec's own messages (codecs it could not load: nvJPEG2000, nvTIFF, not needed here; a file it
#: could not decode: the caller decodes it on the host and counts it) are off unless the user sets this
VERBOSITY_VAR = "PYNVIMGCODEC_VERBOSITY"

#: a 16 x 16 JPEG (4:2:0): red on the left half, blue on the right; status() decodes it
_PROBE = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERXRTc4UG1RV19iZ2hn"
    "Pk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2Nj"
    "Y2P/wAARCAAQABADASIAAhEBAxEB/8QAFQABAQAAAAAAAAAAAAAAAAAAAQX/xAAUEAEAAAAAAAAAAAAAAAAAAAAA/8QAFAEBAAAAAAAA"
    "AAAAAAAAAAAABP/EABgRAAIDAAAAAAAAAAAAAAAAAAAFQoHB/9oADAMBAAIRAxEAPwCWCC1U60S4heH/2Q==")
#: its top-left pixel as libjpeg-turbo decodes it, and how far a GPU decoder may be from it
_PROBE_PIXEL, _PROBE_TOLERANCE = (200, 41, 38), 12

_lock = threading.Lock()
_state = {}                 # "module", "why", "preloaded"; per device id: its BatchDecoder or the reason


# ---- loading --------------------------------------------------------------------------------------
def nvimgcodec_cuda_major(paths):
    """The CUDA major version of the nvImageCodec wheel installed in one of `paths` (from its
    dist-info directory, nvidia_nvimgcodec_cu<major>-<version>.dist-info), or None."""
    for p in paths:
        for d in sorted(glob.glob(os.path.join(glob.escape(str(p)), "nvidia_nvimgcodec_cu*.dist-info"))):
            m = re.match(r"nvidia_nvimgcodec_cu(\d+)-", os.path.basename(d))
            if m:
                return int(m.group(1))
    return None


def nvjpeg_libraries(paths, major=None):
    """The libnvjpeg files to preload from the `nvidia/<package>/lib` directories under `paths`: the
    first libnvjpeg.so.<major> when the CUDA major is known (nvImageCodec opens that soname and no
    other), else the first of each major found."""
    by_major = {}
    for p in paths:
        for f in sorted(glob.glob(os.path.join(glob.escape(str(p)), "nvidia", "*", "lib", "libnvjpeg.so.*"))):
            m = re.fullmatch(r"libnvjpeg\.so\.(\d+)(\.[\d.]+)?", os.path.basename(f))
            if m:
                by_major.setdefault(int(m.group(1)), f)
    if major is not None:
        return [by_major[major]] if major in by_major else []
    return [by_major[k] for k in sorted(by_major)]


def preload_nvjpeg(paths=None):
    """Load the libnvjpeg that nvImageCodec will open (see the module docstring) from the directories
    `paths` (default sys.path); returns the files loaded. A file that does not load is passed over:
    status() then reports the decoder's own failure."""
    paths = [p for p in (sys.path if paths is None else paths) if p and os.path.isdir(str(p))]
    loaded = []
    for lib in nvjpeg_libraries(paths, nvimgcodec_cuda_major(paths)):
        try:
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            loaded.append(lib)
        except OSError:
            pass
    return loaded


def module():
    """The nvidia.nvimgcodec module, imported once (libnvjpeg preloaded first), or None when it does
    not import (status() says why)."""
    with _lock:
        if "module" not in _state:
            _state["module"] = None
            try:
                _state["preloaded"] = preload_nvjpeg()
                os.environ.setdefault(VERBOSITY_VAR, "0")
                from nvidia import nvimgcodec
                _state["module"] = nvimgcodec
            except Exception as exc:  # noqa: BLE001 - a missing or broken install both mean "not available"
                _state["why"] = f"nvidia.nvimgcodec does not import ({type(exc).__name__}: {exc}): {INSTALL}"
    return _state["module"]


# ---- decoding -------------------------------------------------------------------------------------
def parse(mod, data):
    """(code stream, width, height) of a JPEG file's bytes that the GPU may decode (1 or 3 components),
    else None (not a JPEG, a header nvImageCodec cannot read, CMYK). `mod`: the nvimgcodec module
    (parsing needs no GPU)."""
    try:
        cs = mod.CodeStream(data)
        if cs.codec_name != "jpeg" or cs.num_channels not in (1, 3):
            return None
        return cs, int(cs.width), int(cs.height)
    except Exception:  # noqa: BLE001 - whatever the parser refuses goes to the host decoder
        return None


class BatchDecoder:
    """nvImageCodec's decoder on one device, with its stream (see the module docstring)."""

    def __init__(self, mod, device_id, threads, kinds=KINDS, options=OPTIONS):
        """kinds: nvImageCodec's BackendKind names, in order of preference; options: its codec options."""
        import cupy
        self.mod, self.version = mod, getattr(mod, "__version__", "?")
        self.decoder = mod.Decoder(device_id=device_id, max_num_cpu_threads=max(1, int(threads)),
                                   backends=[mod.Backend(getattr(mod.BackendKind, k)) for k in kinds],
                                   options=options)
        self.params = mod.DecodeParams(apply_exif_orientation=False, color_spec=mod.ColorSpec.SRGB,
                                       allow_any_depth=False)
        with cupy.cuda.Device(device_id):
            # (nvImageCodec decodes on streams of its own and orders them after and before this one)
            self.stream = cupy.cuda.Stream(non_blocking=True)
        # one batch at a time: a worker's pipelines (training, evaluation) may read ahead together
        self.lock = threading.Lock()

    def parse(self, data):
        """parse(module, data) with this decoder's module."""
        return parse(self.mod, data)

    def decode(self, code_streams, after=None):
        """(images, failure): the decoded images (uint8 RGB in device memory) of `code_streams`, None
        where the GPU could not decode one; failure: why the whole batch came back without images, else
        None. after=None: complete when this returns (the caller's thread waits for the decoder's
        stream); after=a CUDA stream: the decoding starts after the work that stream has queued, and the
        stream waits for it, the host for neither."""
        if not code_streams:
            return [], None
        failure = None
        with self.lock:
            if after is not None:
                self.stream.wait_event(after.record())
            try:
                out = list(self.decoder.decode(list(code_streams), params=self.params,
                                               cuda_stream=self.stream.ptr))
                if len(out) != len(code_streams):      # (before 0.9 the failures were left out of the list)
                    failure = f"nvImageCodec returned {len(out)} images for {len(code_streams)} files"
            except Exception as exc:  # noqa: BLE001 - a failed batch is decoded on the host instead
                failure = f"nvImageCodec failed a batch ({type(exc).__name__}: {exc})"
            if after is None:
                self.stream.synchronize()
            else:
                after.wait_event(self.stream.record())
        return ([None] * len(code_streams), failure) if failure else (out, None)

    @staticmethod
    def view(image):
        """(device address, row pitch in bytes, height, width) of a decoded (H, W, 3) uint8 image, or
        None for any other layout."""
        if image is None:
            return None
        iface = image.__cuda_array_interface__
        shape, strides = tuple(iface["shape"]), iface.get("strides")
        if len(shape) != 3 or shape[2] != 3 or iface["typestr"] != "|u1":
            return None
        pitch = shape[1] * 3 if strides is None else int(strides[0])
        if strides is not None and tuple(strides[1:]) != (3, 1):
            return None
        return int(iface["data"][0]), pitch, int(shape[0]), int(shape[1])


def _probe(dec):
    """None when `dec` decodes the probe JPEG to the right colours, else what went wrong."""
    parsed = dec.parse(_PROBE)
    if parsed is None:
        return "nvImageCodec cannot parse a JPEG header"
    (img,), failure = dec.decode([parsed[0]])
    if img is None:
        return (f"nvImageCodec decoded no JPEG on this GPU ({failure or 'is nvJPEG installed? ' + INSTALL}; set "
                f"{VERBOSITY_VAR}=2 to see its messages)")
    import numpy as np
    pix = np.asarray(img.cpu())
    if pix.shape != (16, 16, 3) or np.abs(pix[0, 0].astype(int) - _PROBE_PIXEL).max() > _PROBE_TOLERANCE:
        return f"nvImageCodec decoded a test JPEG wrongly ({pix.shape}, top-left pixel {pix[0, 0].tolist()})"
    return None


def batch_decoder(threads=0):
    """(BatchDecoder of this worker's device, None) or (None, why GPU decoding is not available here).
    Made once per device and process (its first caller's `threads`: nvImageCodec's own CPU threads)."""
    be = backend.current()
    if not be.is_gpu:
        return None, "the CPU backend (GPU decoding needs dmath's GPU backend)"
    mod = module()
    if mod is None:
        return None, _state["why"]
    key = ("decoder", be.device_id)
    with _lock:
        if key not in _state:
            try:
                # (KINDS and OPTIONS read now, not bound at import: a benchmark may set them before the first
                # decoder)
                dec = BatchDecoder(mod, be.device_id, threads or os.cpu_count() or 1, kinds=KINDS, options=OPTIONS)
                why = _probe(dec)
            except Exception as exc:  # noqa: BLE001 - no usable decoder, whatever the reason
                dec, why = None, f"nvImageCodec's decoder does not start here ({type(exc).__name__}: {exc})"
            _state[key] = (dec, None) if why is None else (None, why)
    return _state[key]


def status(threads=0):
    """(True, what decodes) when JPEG files can be decoded on this worker's GPU, else (False, why not)."""
    dec, why = batch_decoder(threads)
    if dec is None:
        return False, why
    return True, f"nvImageCodec {getattr(dec, 'version', '?')} on GPU {backend.current().device_id}"
