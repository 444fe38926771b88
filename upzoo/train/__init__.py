"""Training: recipes, the segmentation and GAN loops, checkpoints, distributed helpers."""
