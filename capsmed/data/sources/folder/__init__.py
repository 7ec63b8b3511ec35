"""Any folder of class subfolders: images as they are (or resized), grouped by a file
name pattern or a CSV, split by group or into folds."""

from capsmed.data.sources import Source, register
from capsmed.data.sources.folder.config import FolderConfig

SOURCE = register(Source(
    name="folder", package=__name__, domain="generic", config=FolderConfig,
    preprocess="reader:preprocess_folder", synth="synth:write_class_folders",
    recipe="recipe:FolderImage", chooses_domain=True))
