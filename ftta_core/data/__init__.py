"""Dataset loaders: every loader returns an ``ImageArray`` (uint8 NHWC images + int64 labels)."""
from .base import ImageArray
from .cache import DataIntegrityError, decode_packed, verify
from .cifar import load_cifar10, load_cifar100
from .digits import DIGIT_DOMAINS, load_digit_domain, load_embedded_digits, stratified_split
from .office import OFFICE_DOMAINS, load_office_caltech10
from .registry import DATASETS, load_dataset
from .root import DatasetNotFoundError, cache_dir, data_root

__all__ = [
    "ImageArray",
    "DataIntegrityError",
    "DatasetNotFoundError",
    "DATASETS",
    "DIGIT_DOMAINS",
    "OFFICE_DOMAINS",
    "cache_dir",
    "data_root",
    "decode_packed",
    "verify",
    "load_cifar10",
    "load_cifar100",
    "load_dataset",
    "load_digit_domain",
    "load_embedded_digits",
    "load_office_caltech10",
    "stratified_split",
]
