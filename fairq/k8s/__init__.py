"""The Kubernetes generator: ``fairq k8s`` (``cli``) writes the manifests of ``deploy/k8s``
from one file (``render``, with a module per kind of object: ``engines``, ``scaler``,
``certs``, ``keys``, ``secrets``; the file's ``k8s`` blocks: ``spec``), and an engine
pod's preStop drain (``drain``)."""
