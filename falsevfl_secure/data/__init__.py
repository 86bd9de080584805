"""The data layer: dataset loaders, the vertical feature partition, missingness mechanisms and the
labeled/unlabeled vertical splits (see each module's docstring for the rules it implements)."""

from .errors import DataError
from .loaders import CHECKSUMS, DATASETS, Dataset, canonical_name, data_root, load_dataset
from .mechanisms import (
    MAR,
    MCAR,
    MNAR,
    Dirichlet,
    Mechanism,
    mar_visit,
    parse_mechanism,
    piece_variances,
)
from .partition import feature_blocks, split_blocks
from .split import (
    DEFAULT_LABELED,
    TEST_PATTERNS,
    TRAIN_MECHANISMS,
    LabelSide,
    PartyView,
    VerticalSplit,
    make_splits,
    make_test_split,
    make_train_split,
)

__all__ = [
    "CHECKSUMS", "DATASETS", "DEFAULT_LABELED", "MAR", "MCAR", "MNAR", "TEST_PATTERNS", "TRAIN_MECHANISMS",
    "DataError", "Dataset", "Dirichlet", "LabelSide", "Mechanism", "PartyView", "VerticalSplit", "canonical_name",
    "data_root", "feature_blocks", "load_dataset", "make_splits", "make_test_split", "make_train_split", "mar_visit",
    "parse_mechanism",
    "piece_variances", "split_blocks",
]
