"""The model zoo (dnn.models) against torchvision's architectures: parameter counts, state_dict
names and shapes, and, in float64 with the same weights (moved by state_dict and PyTorch's own
load_state_dict), the forward output and one SGD step of ResNet-18, ResNet-50, GoogLeNet and
Inception v3 at small inputs; load_state_dict's refusals. torchvision is not a dependency: the
reference modules below are written with plain torch.nn under torchvision's module names (the
same names, shapes and counts as torchvision 0.28's, checked once against it). Every worker count."""
import math

import numpy as np
import pytest

import dmath
import dnn
from dnn.functional import graph_weight_shapes
from _cases import runs_may_differ

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as TF
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")

COUNTS = [("alexnet", {}, 61_100_840), ("vgg16", {}, 138_357_544), ("resnet18", {}, 11_689_512),
          ("resnet50", {}, 25_557_032), ("googlenet", {}, 6_624_904), ("googlenet", {"aux_logits": True}, 13_004_888),
          ("inception_v3", {"aux_logits": False}, 23_834_568), ("inception_v3", {}, 27_161_264)]


@pytest.mark.parametrize("name,kwargs,count", COUNTS)
def test_parameter_counts_are_torchvisions(name, kwargs, count):
    graph = getattr(dnn.models, name)(_graph_only=True, **kwargs)     # nothing allocated
    shapes = graph_weight_shapes(graph)
    params = sum(math.prod(s) for n, s in shapes if not n.endswith(("running_mean", "running_var")))
    assert params == count


def test_a_built_zoo_model_counts_the_same():
    m = dnn.models.googlenet(num_classes=10, input_shape=(3, 32, 32))
    assert m.count_params() == 6_624_904 - 1024 * 990 - 990
    assert m.count_trainable_params() == m.count_params()
    assert "inception4a.branch2.1.conv" in [layer.name for layer in m.layers]


# ---- torchvision's modules in plain torch.nn (the names are what matters) -----------------------------
if torch is not None:
    class BasicConv2d(nn.Module):
        def __init__(self, cin, cout, eps=1e-3, **kw):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, bias=False, **kw)
            self.bn = nn.BatchNorm2d(cout, eps=eps)

        def forward(self, x):
            return TF.relu(self.bn(self.conv(x)))

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            h = self.bn2(self.conv2(TF.relu(self.bn1(self.conv1(x)))))
            return TF.relu(h + (self.downsample(x) if self.downsample is not None else x))

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.downsample = downsample

        def forward(self, x):
            h = TF.relu(self.bn1(self.conv1(x)))
            h = TF.relu(self.bn2(self.conv2(h)))
            h = self.bn3(self.conv3(h))
            return TF.relu(h + (self.downsample(x) if self.downsample is not None else x))

    class ResNet(nn.Module):
        def __init__(self, block, counts, num_classes):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            cin = 64
            for i, (planes, n) in enumerate(zip((64, 128, 256, 512), counts)):
                blocks = []
                for j in range(n):
                    stride = 2 if i and not j else 1
                    down = None
                    if stride != 1 or cin != planes * block.expansion:
                        down = nn.Sequential(nn.Conv2d(cin, planes * block.expansion, 1, stride, bias=False),
                                             nn.BatchNorm2d(planes * block.expansion))
                    blocks.append(block(cin, planes, stride, down))
                    cin = planes * block.expansion
                setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = TF.max_pool2d(TF.relu(self.bn1(self.conv1(x))), 3, 2, 1)
            for i in range(4):
                x = getattr(self, f"layer{i + 1}")(x)
            return self.fc(x.mean(dim=(2, 3)))

    class Inception(nn.Module):
        def __init__(self, cin, c1, c3r, c3, c5r, c5, pp):
            super().__init__()
            self.branch1 = BasicConv2d(cin, c1, kernel_size=1)
            self.branch2 = nn.Sequential(BasicConv2d(cin, c3r, kernel_size=1), BasicConv2d(c3r, c3, kernel_size=3,
                                                                                          padding=1))
            self.branch3 = nn.Sequential(BasicConv2d(cin, c5r, kernel_size=1), BasicConv2d(c5r, c5, kernel_size=3,
                                                                                          padding=1))
            self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), BasicConv2d(cin, pp, kernel_size=1))

        def forward(self, x):
            return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)

    class GoogLeNetAux(nn.Module):
        def __init__(self, cin, num_classes):
            super().__init__()
            self.conv = BasicConv2d(cin, 128, kernel_size=1)
            self.fc1 = nn.Linear(2048, 1024)
            self.fc2 = nn.Linear(1024, num_classes)

        def forward(self, x):
            x = self.conv(TF.adaptive_avg_pool2d(x, (4, 4)))
            return self.fc2(TF.relu(self.fc1(torch.flatten(x, 1))))

    class GoogLeNet(nn.Module):
        CFG = [("3a", 192, 64, 96, 128, 16, 32, 32), ("3b", 256, 128, 128, 192, 32, 96, 64), "M3",
               ("4a", 480, 192, 96, 208, 16, 48, 64), ("4b", 512, 160, 112, 224, 24, 64, 64),
               ("4c", 512, 128, 128, 256, 24, 64, 64), ("4d", 512, 112, 144, 288, 32, 64, 64),
               ("4e", 528, 256, 160, 320, 32, 128, 128), "M4", ("5a", 832, 256, 160, 320, 32, 128, 128),
               ("5b", 832, 384, 192, 384, 48, 128, 128)]

        def __init__(self, num_classes, aux_logits=False):
            super().__init__()
            self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
            self.conv2 = BasicConv2d(64, 64, kernel_size=1)
            self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
            for c in self.CFG:
                if c[0] != "M":
                    setattr(self, f"inception{c[0]}", Inception(*c[1:]))
            self.aux1 = GoogLeNetAux(512, num_classes) if aux_logits else None
            self.aux2 = GoogLeNetAux(528, num_classes) if aux_logits else None
            self.fc = nn.Linear(1024, num_classes)

        def forward(self, x):
            x = TF.max_pool2d(self.conv1(x), 3, 2, ceil_mode=True)
            x = TF.max_pool2d(self.conv3(self.conv2(x)), 3, 2, ceil_mode=True)
            for c in self.CFG:
                if c == "M3":
                    x = TF.max_pool2d(x, 3, 2, ceil_mode=True)
                elif c == "M4":
                    x = TF.max_pool2d(x, 2, 2, ceil_mode=True)
                else:
                    x = getattr(self, f"inception{c[0]}")(x)
                    if self.aux1 is not None and c[0] == "4a":
                        aux1 = self.aux1(x)
                    if self.aux2 is not None and c[0] == "4d":
                        aux2 = self.aux2(x)
            out = self.fc(x.mean(dim=(2, 3)))
            return out if self.aux1 is None else (out, aux1, aux2)

    def _bc(cin, cout, k, **kw):
        return BasicConv2d(cin, cout, kernel_size=k, **kw)

    class InceptionA(nn.Module):
        def __init__(self, cin, pf):
            super().__init__()
            self.branch1x1 = _bc(cin, 64, 1)
            self.branch5x5_1, self.branch5x5_2 = _bc(cin, 48, 1), _bc(48, 64, 5, padding=2)
            self.branch3x3dbl_1, self.branch3x3dbl_2 = _bc(cin, 64, 1), _bc(64, 96, 3, padding=1)
            self.branch3x3dbl_3 = _bc(96, 96, 3, padding=1)
            self.branch_pool = _bc(cin, pf, 1)

        def forward(self, x):
            return torch.cat([self.branch1x1(x), self.branch5x5_2(self.branch5x5_1(x)),
                              self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                              self.branch_pool(TF.avg_pool2d(x, 3, 1, 1))], 1)

    class InceptionB(nn.Module):
        def __init__(self, cin):
            super().__init__()
            self.branch3x3 = _bc(cin, 384, 3, stride=2)
            self.branch3x3dbl_1, self.branch3x3dbl_2 = _bc(cin, 64, 1), _bc(64, 96, 3, padding=1)
            self.branch3x3dbl_3 = _bc(96, 96, 3, stride=2)

        def forward(self, x):
            return torch.cat([self.branch3x3(x), self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x))),
                              TF.max_pool2d(x, 3, 2)], 1)

    class InceptionC(nn.Module):
        def __init__(self, cin, c7):
            super().__init__()
            self.branch1x1 = _bc(cin, 192, 1)
            self.branch7x7_1, self.branch7x7_2 = _bc(cin, c7, 1), _bc(c7, c7, (1, 7), padding=(0, 3))
            self.branch7x7_3 = _bc(c7, 192, (7, 1), padding=(3, 0))
            self.branch7x7dbl_1 = _bc(cin, c7, 1)
            self.branch7x7dbl_2 = _bc(c7, c7, (7, 1), padding=(3, 0))
            self.branch7x7dbl_3 = _bc(c7, c7, (1, 7), padding=(0, 3))
            self.branch7x7dbl_4 = _bc(c7, c7, (7, 1), padding=(3, 0))
            self.branch7x7dbl_5 = _bc(c7, 192, (1, 7), padding=(0, 3))
            self.branch_pool = _bc(cin, 192, 1)

        def forward(self, x):
            d = x
            for k in range(1, 6):
                d = getattr(self, f"branch7x7dbl_{k}")(d)
            return torch.cat([self.branch1x1(x), self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x))), d,
                              self.branch_pool(TF.avg_pool2d(x, 3, 1, 1))], 1)

    class InceptionD(nn.Module):
        def __init__(self, cin):
            super().__init__()
            self.branch3x3_1, self.branch3x3_2 = _bc(cin, 192, 1), _bc(192, 320, 3, stride=2)
            self.branch7x7x3_1, self.branch7x7x3_2 = _bc(cin, 192, 1), _bc(192, 192, (1, 7), padding=(0, 3))
            self.branch7x7x3_3, self.branch7x7x3_4 = _bc(192, 192, (7, 1), padding=(3, 0)), _bc(192, 192, 3, stride=2)

        def forward(self, x):
            b7 = x
            for k in range(1, 5):
                b7 = getattr(self, f"branch7x7x3_{k}")(b7)
            return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), b7, TF.max_pool2d(x, 3, 2)], 1)

    class InceptionE(nn.Module):
        def __init__(self, cin):
            super().__init__()
            self.branch1x1 = _bc(cin, 320, 1)
            self.branch3x3_1 = _bc(cin, 384, 1)
            self.branch3x3_2a, self.branch3x3_2b = _bc(384, 384, (1, 3), padding=(0, 1)), _bc(384, 384, (3, 1),
                                                                                               padding=(1, 0))
            self.branch3x3dbl_1, self.branch3x3dbl_2 = _bc(cin, 448, 1), _bc(448, 384, 3, padding=1)
            self.branch3x3dbl_3a = _bc(384, 384, (1, 3), padding=(0, 1))
            self.branch3x3dbl_3b = _bc(384, 384, (3, 1), padding=(1, 0))
            self.branch_pool = _bc(cin, 192, 1)

        def forward(self, x):
            b3 = self.branch3x3_1(x)
            d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
            return torch.cat([self.branch1x1(x), torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1),
                              torch.cat([self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d)], 1),
                              self.branch_pool(TF.avg_pool2d(x, 3, 1, 1))], 1)

    class InceptionAux(nn.Module):
        def __init__(self, cin, num_classes):
            super().__init__()
            self.conv0, self.conv1 = _bc(cin, 128, 1), _bc(128, 768, 5)
            self.fc = nn.Linear(768, num_classes)

        def forward(self, x):
            return self.fc(self.conv1(self.conv0(TF.avg_pool2d(x, 5, 3))).mean(dim=(2, 3)))

    class Inception3(nn.Module):
        def __init__(self, num_classes, aux_logits):
            super().__init__()
            self.Conv2d_1a_3x3, self.Conv2d_2a_3x3 = _bc(3, 32, 3, stride=2), _bc(32, 32, 3)
            self.Conv2d_2b_3x3, self.Conv2d_3b_1x1 = _bc(32, 64, 3, padding=1), _bc(64, 80, 1)
            self.Conv2d_4a_3x3 = _bc(80, 192, 3)
            self.Mixed_5b, self.Mixed_5c, self.Mixed_5d = InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64)
            self.Mixed_6a = InceptionB(288)
            self.Mixed_6b, self.Mixed_6c = InceptionC(768, 128), InceptionC(768, 160)
            self.Mixed_6d, self.Mixed_6e = InceptionC(768, 160), InceptionC(768, 192)
            self.AuxLogits = InceptionAux(768, num_classes) if aux_logits else None
            self.Mixed_7a, self.Mixed_7b, self.Mixed_7c = InceptionD(768), InceptionE(1280), InceptionE(2048)
            self.fc = nn.Linear(2048, num_classes)

        def forward(self, x):
            x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
            x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(TF.max_pool2d(x, 3, 2)))
            x = TF.max_pool2d(x, 3, 2)
            for n in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e"):
                x = getattr(self, f"Mixed_{n}")(x)
            aux = self.AuxLogits(x) if self.AuxLogits is not None else None
            for n in ("7a", "7b", "7c"):
                x = getattr(self, f"Mixed_{n}")(x)
            out = self.fc(x.mean(dim=(2, 3)))
            return out if aux is None else (out, aux)


def _torch_model(name, num_classes, **kwargs):
    if name == "resnet18":
        return ResNet(BasicBlock, (2, 2, 2, 2), num_classes)
    if name == "resnet50":
        return ResNet(Bottleneck, (3, 4, 6, 3), num_classes)
    if name == "googlenet":
        return GoogLeNet(num_classes, kwargs.get("aux_logits", False))
    return Inception3(num_classes, kwargs.get("aux_logits", True))


CASES = [("resnet18", 32, {}), ("resnet50", 32, {}), ("googlenet", 32, {"dropout": 0.0}),
         ("googlenet", 32, {"aux_logits": True, "dropout": 0.0, "dropout_aux": 0.0}),
         ("inception_v3", 75, {"aux_logits": False, "dropout": 0.0})]


@needs_torch
@pytest.mark.parametrize("name,size,kwargs", CASES)
def test_forward_and_one_sgd_step_match_pytorch(name, size, kwargs):
    """Same weights (dnn's state_dict loaded by PyTorch, strictly): the same softmax outputs in
    evaluation mode, then one SGD step on a training batch (batch statistics, running statistics
    and num_batches_tracked updated) gives the same state dict; float64."""
    classes, n = 10, 4
    dmath.random.seed(11)
    model = getattr(dnn.models, name)(num_classes=classes, input_shape=(3, size, size), dtype="float64",
                                      optimizer=dnn.optim.SGD(lr=0.05), **kwargs)
    ref = _torch_model(name, classes, **kwargs).double()
    state = model.state_dict()
    assert list(state) == list(ref.state_dict())
    ref.load_state_dict({k: torch.tensor(v) for k, v in state.items()})        # strict: same names and shapes
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(n, 3, size, size)), rng.integers(0, classes, n)
    xt = torch.tensor(x)
    ref.eval()
    with torch.no_grad():
        want = ref(xt)
    got = model.predict(x)
    for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, tuple) else [want]):
        np.testing.assert_allclose(g, torch.softmax(w, 1).numpy(), rtol=1e-9, atol=1e-12)
    ref.train()
    out, target = ref(xt), torch.tensor(y)
    if isinstance(out, tuple):          # the main output, then the auxiliary heads weighted 0.3
        loss = TF.cross_entropy(out[0], target) + sum(0.3 * TF.cross_entropy(o, target) for o in out[1:])
    else:
        loss = TF.cross_entropy(out, target)
    loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.05 * p.grad
    hist = model.fit(x, y, batch_size=n, epochs=1, shuffle=False, verbose=0)
    assert hist["loss"][0] == pytest.approx(loss.item(), rel=1e-9)
    after = model.state_dict()
    for k, v in ref.state_dict().items():
        # batch statistics over 4 samples of a 1x1 map amplify float64 rounding (gradients of
        # hundreds): each tensor is compared at a tolerance relative to its largest value
        v = v.numpy()
        np.testing.assert_allclose(after[k], v, rtol=1e-7, atol=1e-9 * max(np.abs(v).max(), 1.0), err_msg=k)


@needs_torch
def test_googlenet_channels_last_rows_give_the_same_step():
    """The zoo's branchy graph in channels-last rows (how it runs on GPUs) equals the NCHW run."""
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(4, 3, 32, 32)), rng.integers(0, 10, 4)
    models = []
    for channels_last in (False, True):
        dmath.random.seed(12)
        m = dnn.models.googlenet(num_classes=10, input_shape=(3, 32, 32), dtype="float64", dropout=0.0,
                                 optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9), channels_last=channels_last)
        m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        models.append(m.state_dict())
    for k, v in models[0].items():
        # (the sums of the two row orders differ in their last bits, which batch statistics of four
        # values per channel amplify: compared relative to each tensor's largest value)
        np.testing.assert_allclose(models[1][k], v, rtol=1e-8, atol=1e-9 * max(np.abs(v).max(), 1.0), err_msg=k)


def test_load_state_dict_refuses_a_mismatch_and_changes_nothing():
    dmath.random.seed(13)
    model = dnn.models.resnet18(num_classes=4, input_shape=(3, 32, 32), dtype="float64")
    state = model.state_dict()
    assert state["bn1.num_batches_tracked"].dtype == np.int64 and state["bn1.num_batches_tracked"].shape == ()
    assert state["fc.weight"].shape == (4, 512)          # PyTorch's (out, in)
    other = {k: (v + 1 if v.dtype.kind == "f" else v + 3) for k, v in state.items()}
    missing = dict(other)
    del missing["layer1.0.bn1.running_mean"]
    with pytest.raises(dnn.ConfigError, match=r"missing keys: \['layer1.0.bn1.running_mean'\]"):
        model.load_state_dict(missing)
    extra = dict(other, **{"layer5.0.conv1.weight": np.zeros(1)})
    with pytest.raises(dnn.ConfigError, match="unexpected keys"):
        model.load_state_dict(extra)
    with pytest.raises(dnn.ConfigError, match=r"unexpected keys: \['zzz', 7\]"):    # (a bare TypeError before)
        model.load_state_dict({**other, "zzz": np.zeros(1), 7: np.zeros(1)})
    wrong = dict(other, **{"fc.weight": np.zeros((512, 4))})
    with pytest.raises(dnn.ShapeError, match="fc.weight"):
        model.load_state_dict(wrong)
    # values that are no weights: refused by name with a dnn error, never NumPy's or Python's own
    bad_bias = [([[1.0, 2.0], [3.0]], "not an array of numbers"), (np.full(4, np.nan), "NaN or infinity"),
                (np.array([1e300, 0, 0, 0], dtype=object), "not an array of numbers")]
    for value, message in bad_bias:
        with pytest.raises(dnn.ShapeError, match=message):
            model.load_state_dict(dict(other, **{"fc.bias": value}))
    for value in ("5", None, 10 ** 30, -1, 2.5):
        with pytest.raises(dnn.ShapeError, match="bn1.num_batches_tracked (must be one non-negative|is not an)"):
            model.load_state_dict(dict(other, **{"bn1.num_batches_tracked": value}))
    after = model.state_dict()
    for k in state:
        np.testing.assert_array_equal(after[k], state[k])
    model.load_state_dict(other)
    after = model.state_dict()
    for k in state:
        np.testing.assert_array_equal(after[k], other[k])
    assert int(after["bn1.num_batches_tracked"]) == 3


def test_zoo_argument_errors():
    with pytest.raises(dnn.ConfigError, match="num_classes"):
        dnn.models.resnet18(num_classes=0, _graph_only=True)
    with pytest.raises(dnn.ConfigError, match="too small"):
        dnn.models.inception_v3(input_shape=(3, 64, 64), _graph_only=True)
    with pytest.raises(dnn.ConfigError, match="aux_logits"):
        dnn.models.inception_v3(input_shape=(3, 160, 160), _graph_only=True)
    with pytest.raises(dnn.ConfigError, match="aux_logits"):
        dnn.models.googlenet(aux_logits=1, _graph_only=True)
    with pytest.raises(dnn.ConfigError, match="sync_batchnorm must be True or False"):
        dnn.models.resnet18(sync_batchnorm="no", _graph_only=True)
    g = dnn.models.googlenet(aux_logits=True, _graph_only=True)     # 14x14 pools to 4x4 in uneven windows
    assert len(g.outputs) == 3


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_resnet_backward_shortcuts_change_no_bit(monkeypatch, dtype, channels_last):
    """ResNet's backward takes two shortcuts: a BatchNorm + relu without a residual recomputes the
    relu's mask from x and beta (Y is not read), and a block output's gradient reaches its BatchNorm as
    the two terms of its two readers, added as the kernels read them. Both are used, and two SGD steps
    with momentum give the very weights the plain backward (mask from Y, the sum made first) gives: bit
    for bit on the CPU. On GPUs at a tolerance: the same model trained twice the same way can differ in
    its last bits there (cuDNN's plans, chosen per process, include kernels whose sums' order varies),
    and batch statistics of four values per channel amplify them; the BatchNorm kernels alone are
    checked bitwise at their vector widths in test_nn_norm."""
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(4, 3, 32, 32)), rng.integers(0, 10, 4)
    seen = {"beta": 0, "dy2": 0}
    plain = dmath.nn.batchnorm_backward

    def spy(*args, **kw):
        seen["beta"] += kw.get("beta") is not None
        seen["dy2"] += kw.get("dy2") is not None
        return plain(*args, **kw)
    monkeypatch.setattr(dmath.nn, "batchnorm_backward", spy)

    def trained():
        dmath.random.seed(13)
        m = dnn.models.resnet18(num_classes=10, input_shape=(3, 32, 32), dtype=dtype, channels_last=channels_last,
                                optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9))
        m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return m.state_dict()
    fast = trained()
    # ResNet-18: 8 blocks; the relu'd BatchNorms without a residual (stem + one per block) recompute
    # the mask; the outputs of blocks 1-7 are read twice (the next block's conv and its shortcut). The
    # first step is recorded, the second replays it: one backward issued from Python
    assert seen == {"beta": 9, "dy2": 7}, seen
    monkeypatch.setattr(dnn.ops.normalization.BatchNorm, "takes_gradient_terms", False)
    monkeypatch.setattr(dnn.ops.normalization.BatchNorm, "_remask", lambda self: False)
    seen.update(beta=0, dy2=0)
    slow = trained()
    assert seen == {"beta": 0, "dy2": 0}
    # (DMATH_DETERMINISTIC=1: the GPU runs too are compared bit for bit)
    gpu = runs_may_differ()
    for k, v in slow.items():
        if gpu:
            scale = max(float(np.abs(v).max()), 1.0)
            # (float32: a plan's last-bit differences grow to 3e-4 in two steps here, seen on one H100;
            # a wrong shortcut moves weights by lr x gradient, 1e-2 and more)
            np.testing.assert_allclose(fast[k], v, rtol=1e-2 if dtype == "float32" else 1e-9,
                                       atol=(2e-3 if dtype == "float32" else 1e-11) * scale, err_msg=k)
        else:
            np.testing.assert_array_equal(fast[k], v, err_msg=k)
