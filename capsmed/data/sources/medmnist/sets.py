"""The MedMNIST sets as published (MedMNIST v2, Yang et al., Scientific Data 2023, and
the MedMNIST+ sizes of release 3): class names, channels, task, published split sizes
and each file's MD5, with the image domain capsmed records for each 2D set.

Standard library only: the command line reads the set names for its help.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SIZES = (28, 64, 128, 224)  # image side of <flag>.npz, <flag>_64.npz, _128, _224
# Zenodo record of MedMNIST release 3 (v2 data at 28 px, plus MedMNIST+ sizes)
RECORD = "https://zenodo.org/records/10519652/files/"
MULTI_LABEL = "multi-label, binary-class"
ORDINAL = "ordinal-regression"

_ORGANS = ("bladder", "femur-left", "femur-right", "heart", "kidney-left", "kidney-right",
           "liver", "lung-left", "lung-right", "pancreas", "spleen")


@dataclass(frozen=True)
class MedmnistSet:
    """One published MedMNIST 2D set.

    Attributes:
        flag: Its name and file stem (``bloodmnist`` -> ``bloodmnist.npz``).
        about: What the images are, in a few words.
        classes: Class names, index = label, as published.
        channels: 1 (grey) or 3 (RGB).
        task: ``multi-class``, ``binary-class``, ``ordinal-regression`` or
            ``multi-label, binary-class`` (the published task).
        domain: The image domain capsmed records (:mod:`capsmed.data.domains`).
        samples: Published (train, val, test) sizes.
        md5: ``{size: MD5}`` of the published files.
        older_md5: ``{size: MD5}`` of an earlier release's files (still accepted as
            published; the 28 px organ sets were re-issued in release 3).
    """

    flag: str
    about: str
    classes: tuple[str, ...]
    channels: int
    task: str
    domain: str
    samples: tuple[int, int, int]
    md5: dict[int, str]
    older_md5: dict[int, str] = field(default_factory=dict)

    def file_name(self, size: int) -> str:
        """The published file name at ``size`` px."""
        return f"{self.flag}.npz" if size == 28 else f"{self.flag}_{size}.npz"


def _md5(*values: str) -> dict[int, str]:
    return dict(zip(SIZES, values, strict=True))


# Domains: the training defaults follow what a flip or a rotation does to a class.
# Cells (blood, kidney) and H&E tissue have no orientation; dermoscopy, OCT, X-ray,
# ultrasound and CT slices do (a left kidney flipped is labelled right), so they are
# generic: rotations only.
SETS: dict[str, MedmnistSet] = {s.flag: s for s in (
    MedmnistSet("pathmnist", "colon histology, H&E (NCT-CRC-HE-100K, CRC-VAL-HE-7K)",
                ("adipose", "background", "debris", "lymphocytes", "mucus",
                 "smooth muscle", "normal colon mucosa", "cancer-associated stroma",
                 "colorectal adenocarcinoma epithelium"), 3, "multi-class", "histology",
                (89996, 10004, 7180),
                _md5("a8b06965200029087d5bd730944a56c1", "55aa9c1e0525abe5a6b9d8343a507616",
                     "ac42d08fb904d92c244187169d1fd1d9", "2c51a510bcdc9cf8ddb2af93af1eadec")),
    MedmnistSet("chestmnist", "chest X-ray (NIH ChestX-ray14), 14 findings",
                ("atelectasis", "cardiomegaly", "effusion", "infiltration", "mass",
                 "nodule", "pneumonia", "pneumothorax", "consolidation", "edema",
                 "emphysema", "fibrosis", "pleural", "hernia"), 1, MULTI_LABEL, "generic",
                (78468, 11219, 22433),
                _md5("02c8a6516a18b556561a56cbdd36c4a8", "9de6cd0b934ebb5b7426cfba5efbae16",
                     "db107e5590b27930b62dbaf558aebee3", "45bd33e6f06c3e8cdb481c74a89152aa")),
    MedmnistSet("dermamnist", "dermatoscopy (HAM10000)",
                ("actinic keratoses and intraepithelial carcinoma", "basal cell carcinoma",
                 "benign keratosis-like lesions", "dermatofibroma", "melanoma",
                 "melanocytic nevi", "vascular lesions"), 3, "multi-class", "generic",
                (7007, 1003, 2005),
                _md5("0744692d530f8e62ec473284d019b0c7", "b70a2f5635c6199aeaa28c31d7202e1f",
                     "2defd784463fa5243564e855ed717de1", "8974907d8e169bef5f5b96bc506ae45d")),
    MedmnistSet("octmnist", "retinal OCT", ("choroidal neovascularization",
                                            "diabetic macular edema", "drusen", "normal"),
                1, "multi-class", "generic", (97477, 10832, 1000),
                _md5("c68d92d5b585d8d81f7112f81e2d0842", "e229e9440236b774d9f0dfef9d07bdaf",
                     "0a97e76651ace45c5d943ee3f65b63ae", "abc493b6d529d5de7569faaef2773ba3")),
    MedmnistSet("pneumoniamnist", "paediatric chest X-ray", ("normal", "pneumonia"), 1,
                "binary-class", "generic", (4708, 524, 624),
                _md5("28209eda62fecd6e6a2d98b1501bb15f", "8f4eceb4ccffa70c672198ea285246c6",
                     "05b46931834c231683c68f40c47b2971", "d6a3c71de1b945ea11211b03746c1fe1")),
    MedmnistSet("retinamnist", "fundus photographs (DeepDRiD), 5 DR grades",
                ("0", "1", "2", "3", "4"), 3, ORDINAL, "fundus", (1080, 120, 400),
                _md5("bd4c0672f1bba3e3a89f0e4e876791e4", "afda852cc34dcda56f86ad2b2457dbcc",
                     "e48e916a24454daf90583d4e6efb1a18", "eae7e3b6f3fcbda4ae613ebdcbe35348")),
    MedmnistSet("breastmnist", "breast ultrasound", ("malignant", "normal, benign"), 1,
                "binary-class", "generic", (546, 78, 156),
                _md5("750601b1f35ba3300ea97c75c52ff8f6", "742edef2a1fd1524b2efff4bd7ba9364",
                     "363e4b3f8d712e9b5de15470a2aaadf1", "b56378a6eefa9fed602bb16d192d4c8b")),
    MedmnistSet("bloodmnist", "blood-cell microscopy (peripheral blood smears)",
                ("basophil", "eosinophil", "erythroblast",
                 "immature granulocytes(myelocytes, metamyelocytes and promyelocytes)",
                 "lymphocyte", "monocyte", "neutrophil", "platelet"), 3, "multi-class",
                "cytology", (11959, 1712, 3421),
                _md5("7053d0359d879ad8a5505303e11de1dc", "2b94928a2ae4916078ca51e05b6b800b",
                     "adace1e0ed228fccda1f39692059dd4c", "b718ff6835fcbdb22ba9eacccd7b2601")),
    MedmnistSet("tissuemnist", "kidney cortex cells, fluorescence microscopy (BBBC051)",
                ("Collecting Duct, Connecting Tubule", "Distal Convoluted Tubule",
                 "Glomerular endothelial cells", "Interstitial endothelial cells",
                 "Leukocytes", "Podocytes", "Proximal Tubule Segments",
                 "Thick Ascending Limb"), 1, "multi-class", "cytology",
                (165466, 23640, 47280),
                _md5("ebe78ee8b05294063de985d821c1c34b", "123ece2eba09d0aa5d698fda57103344",
                     "61b955355d7425a89687b06cca3ce0c2", "b077128c4a949f0a4eb01517f9037b9c")),
    MedmnistSet("organamnist", "abdominal CT, axial slices (LiTS)", _ORGANS, 1,
                "multi-class", "generic", (34561, 6491, 17778),
                _md5("68e3f8846a6bd62f0c9bf841c0d9eacc", "2dcccc29b88e6da5a01161ef20cda288",
                     "eeae80d0a227a8d099027e1b3cfd3b60", "50747347e05c87dd3aaf92c49f9f3170"),
                {28: "866b832ed4eeba67bfb9edee1d5544e6"}),
    MedmnistSet("organcmnist", "abdominal CT, coronal slices (LiTS)", _ORGANS, 1,
                "multi-class", "generic", (12975, 2392, 8216),
                _md5("b9ceb9546e10131b32923c5bbeaea2b1", "3ce34a8724ea6f548e6db4744d03b6a9",
                     "773c1f009daa3fe5d9a2a201b2a7ed94", "050f5e875dc056f6768abf94ec9995d1"),
                {28: "0afa5834fb105f7705a7d93372119a21"}),
    MedmnistSet("organsmnist", "abdominal CT, sagittal slices (LiTS)", _ORGANS, 1,
                "multi-class", "generic", (13932, 2452, 8827),
                _md5("9ab87b696fb54e2a387ebe992d6ed5f1", "53a6d115339d874c25e309a994ff46d3",
                     "ded0c5fa01a95dc4978b956f613e9b8e", "b354719e553fbbb2513d5533f52a4cb1"),
                {28: "e5c39f1af030238290b9557d9503af9d"}),
)}
# The 3D sets (28x28x28 volumes): recognised by name only to be refused clearly.
SETS_3D = ("organmnist3d", "nodulemnist3d", "adrenalmnist3d", "fracturemnist3d",
           "vesselmnist3d", "synapsemnist3d")
# The sets a capsmed classifier trains on as published (ChestMNIST is multi-label;
# RetinaMNIST's grades are ordinal and train as classes only when asked).
SINGLE_LABEL = tuple(f for f, s in SETS.items() if s.task != MULTI_LABEL)
