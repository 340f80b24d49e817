"""The CSI node plugin (driver `fusevol.io`): kubelet's way to put a fusevol volume into a pod.

kubelet calls NodePublishVolume with a target path inside its pod directory; the agent serves
what the pod's `volumeAttributes` describe (a configMap, secret, downwardAPI or projected volume
source) at that path, through its one reconciler, as it serves pod-spec volumes.

    csi.proto, csi_pb2.py(i)  the CSI v1 messages used (generated: see csi.proto's header)
    attributes.py             request -> what to serve, for whom, where; every check on its input
    node.py                   publish / unpublish / restore, in trio, through the reconciler
    preparing.py              a pod's volumes made ready on its arrival: a publish is one bind
    pods.py                   which pod a request is for, as the source knows it
    tokens.py                 a volume's token projections: kubelet's tokens, or requested
    waiting.py                a publish's or unpublish's wait for the reconciler
    state.py                  the published targets, recorded under <root>/fusevol (no secrets)
    server.py                 the gRPC Identity and Node services on a unix socket
    registration.py           kubelet's plugin registration of the driver (its own socket)
"""
