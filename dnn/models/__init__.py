"""The model zoo: torchvision's architectures as dnn.Model graphs, with its parameter names.

    model = dnn.models.resnet50(num_classes=1000, input_shape=(3, 224, 224), dtype='float16',
                                optimizer=dnn.optim.SGD(lr=0.1, momentum=0.9))
    model.load_state_dict(weights)        # {'conv1.weight': array, 'layer1.0.bn1.running_mean': ...}

Each builder takes num_classes, input_shape (C, H, W), dtype and optimizer
(and torchvision's dropout / aux_logits where it has them) and sync_batchnorm
(True: BatchNorm statistics over the whole global batch, as SyncBatchNorm;
False: each data-parallel worker's own, as PyTorch's BatchNorm under DDP);
other keyword arguments go to dnn.Model. The parameter counts are torchvision's:

    alexnet 61,100,840   vgg16 138,357,544   resnet18 11,689,512   resnet50 25,557,032
    googlenet 6,624,904 (13,004,888 with aux_logits=True)   inception_v3 27,161,264 (aux) / 23,834,568
"""
from .classic import alexnet, vgg16
from .googlenet import googlenet
from .inception import inception_v3
from .resnet import resnet18, resnet50

__all__ = ["alexnet", "vgg16", "resnet18", "resnet50", "googlenet", "inception_v3"]
