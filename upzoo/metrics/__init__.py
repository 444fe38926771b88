"""Metrics: dataset-level confusion matrix, IoU, mIoU, pixel accuracy, Dice; Boundary IoU, the
boundary F-score and DAVIS's boundary F-measure (2D); HD95 and the normalised surface Dice (3D, in
mm); image checkerboard; and the generative metrics — radial power spectrum, spectral error and
decay, sliced Wasserstein distance, KID and FD on any feature extractor, and ``RealImages``, which
holds a real set's statistics for them all; PSNR and SSIM with the super-resolution conventions.
Each comes as a function and, where it streams, a class built on :class:`StreamingMetric` (declared
states, ``reset``, ``sync`` across DDP ranks). Functions that return several values return named
tuples (:mod:`upzoo.metrics.results`: read by name, unpack as before)."""

from upzoo.metrics.boundary import BoundaryFScore, BoundaryIoU, boundary_fscore, boundary_iou
from upzoo.metrics.checkerboard import image_checkerboard
from upzoo.metrics.confusion import (
    ConfusionMatrix,
    confusion_matrix,
    dice_from_confusion,
    iou_from_confusion,
    mean_iou,
    pixel_accuracy,
)
from upzoo.metrics.davis import davis_fmeasure
from upzoo.metrics.feature_distance import (
    FeatureDistances,
    FeatureExtractor,
    encoder_features,
    frechet_distance,
    inception_features,
    kernel_distance,
    module_features,
    pretrained_features,
)
from upzoo.metrics.generative import GenerativeReport, RealImages
from upzoo.metrics.image_quality import ImageQuality, psnr, psnr_ssim, rgb_to_y, ssim
from upzoo.metrics.results import (
    ClassScores,
    FrameScores,
    ImageScores,
    KernelDistance,
    SpectralError,
    SurfaceScores,
)
from upzoo.metrics.sliced_wasserstein import SlicedWasserstein, swd
from upzoo.metrics.spectrum import (
    RadialSpectrum,
    SpectralDecay,
    corner_error,
    image_spectral_error,
    radial_power_spectrum,
    ring_frequencies,
    spectral_decay,
    spectral_error,
)
from upzoo.metrics.streaming import StreamingMetric
from upzoo.metrics.surface import SurfaceMetrics, hausdorff95, surface_dice, surface_distances, surface_metrics

__all__ = [
    "StreamingMetric",
    "ClassScores",
    "FrameScores",
    "SurfaceScores",
    "ImageScores",
    "KernelDistance",
    "SpectralError",
    "ConfusionMatrix",
    "confusion_matrix",
    "dice_from_confusion",
    "iou_from_confusion",
    "mean_iou",
    "pixel_accuracy",
    "image_checkerboard",
    "psnr",
    "ssim",
    "psnr_ssim",
    "rgb_to_y",
    "ImageQuality",
    "BoundaryIoU",
    "boundary_iou",
    "BoundaryFScore",
    "boundary_fscore",
    "davis_fmeasure",
    "SurfaceMetrics",
    "hausdorff95",
    "surface_dice",
    "surface_distances",
    "surface_metrics",
    "RadialSpectrum",
    "radial_power_spectrum",
    "ring_frequencies",
    "spectral_error",
    "image_spectral_error",
    "corner_error",
    "SpectralDecay",
    "spectral_decay",
    "SlicedWasserstein",
    "swd",
    "FeatureExtractor",
    "FeatureDistances",
    "frechet_distance",
    "kernel_distance",
    "module_features",
    "encoder_features",
    "inception_features",
    "pretrained_features",
    "RealImages",
    "GenerativeReport",
]
