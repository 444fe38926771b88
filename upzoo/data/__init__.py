"""Data: Cityscapes-style images, medical volumes, image folders, embedded synthetic defaults and
albumentations pipelines. Import the submodules you need (albumentations loads on first use)."""

import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # albumentations checks for updates at import
