"""KEDA's external-push scaler for fairq's demand (``fairq keda-scaler``): engines wake
as soon as a model's first job is queued (``scaler.server``)."""

from scaler.server import ScalerError, ScalerOptions, serve

__all__ = ["ScalerError", "ScalerOptions", "serve"]
