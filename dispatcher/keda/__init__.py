"""KEDA's external-push scaler for fairq's demand (``fairq keda-scaler``): engines wake
as soon as a model's first job is queued (``dispatcher.keda.server``)."""

from dispatcher.keda.server import ScalerError, ScalerOptions, serve

__all__ = ["ScalerError", "ScalerOptions", "serve"]
