"""Analyses of trained runs beyond the per-class report (``capsmed analyze ...``).

One module per analysis, each writing ``RUN_DIR/analysis/<name>/`` (JSON, CSV, PNG):

* :mod:`.affine`: accuracy under affNIST-like transforms, rotation sweep, flips and a
  real affNIST file (paper 004 section 3.1);
* :mod:`.routing`: coupling-coefficient entropy over training and on the test split
  (paper 003 Fig. 3);
* :mod:`.compactness`: semantic compactness score per latent factor (paper 004 3.3);
* :mod:`.manifold`: two-digit translation grid, t-SNE and Chamfer distance (paper 003
  section 3.2);
* :mod:`.transfer`: AnB / BnB layer transfer (paper 003 section 3.3);
* :mod:`.multimnist`: two-digit accuracy of runs trained on MultiMNIST (paper 004 3.2).
"""
