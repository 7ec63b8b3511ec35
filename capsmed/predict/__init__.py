"""`capsmed predict`: apply a trained run to new images, folders and whole slides."""
