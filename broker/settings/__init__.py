"""fairq's one settings object: environment (``FAIRQ_*``) over a YAML file.

``load_settings()`` reads the environment and the YAML file named by ``FAIRQ_CONFIG``
once, validates everything and returns a frozen ``Settings``. Environment variables win
over the file. Secrets (the Redis URL may hold a password) are ``SecretStr`` and print
masked. Every field has a description, which ``fairq.config_docs`` renders into
``fairq.example.yaml`` and the README's settings table.

One module per concern: ``root`` (``Settings``, its top-level settings by concern),
``engine`` (an entry of ``engines``), ``model`` (a model, its engine's settings
resolved), ``discovery``, ``keys``, ``quotas``, ``http``, ``batch``; ``resolve`` makes each
model that names an engine whole, ``checks`` holds the dependencies between settings.
"""

from broker.settings.batch import BatchSettings
from broker.settings.discovery import DiscoveryConfig, nameserver_address
from broker.settings.engine import DEFAULT_QUEUE_TARGETS, KINDS, EngineConfig, EngineSettings
from broker.settings.http import HttpSettings
from broker.settings.keys import ApiKeyConfig
from broker.settings.model import ModelConfig, ResumeStreams
from broker.settings.quotas import QuotaConfig
from broker.settings.resolve import ENGINE_ON_MODEL, SettingNote, split_entry
from broker.settings.root import (
    CONCERNS,
    DEFAULT_BANDS,
    DEFAULT_SERVICE_TIERS,
    Settings,
    load_settings,
)

__all__ = [
    "CONCERNS",
    "DEFAULT_BANDS",
    "DEFAULT_QUEUE_TARGETS",
    "DEFAULT_SERVICE_TIERS",
    "ENGINE_ON_MODEL",
    "KINDS",
    "ApiKeyConfig",
    "BatchSettings",
    "DiscoveryConfig",
    "EngineConfig",
    "EngineSettings",
    "HttpSettings",
    "ModelConfig",
    "QuotaConfig",
    "ResumeStreams",
    "SettingNote",
    "Settings",
    "load_settings",
    "nameserver_address",
    "split_entry",
]
