"""The mutating admission webhook (`fusevol webhook`): a pod's configMap, secret, downwardAPI and
projected volumes become inline `csi:` volumes of the driver fusevol.io, served as kubelet would
have served them, and `fusevol convert`, which shows it on a manifest.

    convert.py    one pod -> its JSON Patch and report: which volumes, and why not the others
    admission.py  an AdmissionReview -> its answer; every pod is allowed
    cluster.py    the CSIDriver fusevol.io and the namespaces' audit levels, listed and watched
                  (the one `import kubernetes`)
    server.py     HTTPS: /mutate, /healthz, /readyz, /metrics; the certificate reloaded when it
                  changes
    app.py        the webhook's process: the watches, the server, the signals
    manifests.py  `fusevol convert`: the pods and pod templates of a manifest, converted

It runs apart from the agent (a Deployment of the chart) and shares with it only the decoder and
the CSI attribute parser, which reads back every conversion before it is made.
"""
