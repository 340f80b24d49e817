"""Kubernetes objects, as JSON or YAML, into fusevol's model: one decoder for both sources.

    manifest.py        manifest files (YAML, JSON, `kind: List`) -> documents -> objects
    objects.py         one decoded object (a document, or the API server's JSON) -> a model object,
                       with the API server's defaulting and the validation fusevol relies on
    volume_sources.py  a pod's `spec.volumes` and a PV's source -> model volume sources
    reader.py          typed field readers whose errors name the object and the field

Pure functions over decoded data: no I/O, no watching (fusevol.source), no rendering
(fusevol.projection).
"""
