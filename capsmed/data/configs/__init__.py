"""The parameters of every preprocessing source, one frozen dataclass per source.

They live apart from the readers so that the command line can show each option's
default in its help (read from these dataclasses, STYLE 13) without importing OpenCV,
h5py or scikit-image: these modules import nothing heavier than the standard library.
Each source module re-exports its config (``from capsmed.data.sources.tupac16 import
Tupac16Config`` keeps working).
"""
