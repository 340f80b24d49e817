// The floor of `bench/csi_floor.py`, in Go: a CSI node plugin that only binds a directory on the
// target, served by grpc-go as the CSI sidecars and most drivers are. Beside the Python floor
// it says what kubelet's CSI calls cost a driver whose gRPC server is not Python's: on the
// cluster kit (kubelet v1.28, lone pods with 4 volumes), a pod's mounts through it took about
// what kubelet's own volumes take (docs/performance.md, "CSI volumes").
//
// Not built by CI (it needs grpc-go and the CSI spec's Go package): on the cluster kit, put it
// in a directory of Kubernetes v1.28's source tree, whose vendor/ holds both, and
//
//	GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0 go build -o csi-floor-go ./cmd/csi-floor-go
//	csi-floor-go SOCKET SOURCE        (root: binds; serves until killed)
//
// It answers NodeGetInfo (kubelet's registration asks it) and NodeGetCapabilities with
// fusevol.io's one capability (VOLUME_MOUNT_GROUP), binds SOURCE read-only on each target, and
// unmounts it again.
package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

type node struct {
	csipb.UnimplementedNodeServer
	source string
}

func (n *node) NodeGetCapabilities(ctx context.Context, r *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: []*csipb.NodeServiceCapability{{Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: csipb.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP}}}}}, nil
}

func (n *node) NodeGetInfo(ctx context.Context, r *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: "kit-node"}, nil
}

func (n *node) NodePublishVolume(ctx context.Context, r *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	os.MkdirAll(r.TargetPath, 0750)
	if err := syscall.Mount(n.source, r.TargetPath, "", syscall.MS_BIND, ""); err != nil {
		return nil, err
	}
	if err := syscall.Mount("", r.TargetPath, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		return nil, err
	}
	return &csipb.NodePublishVolumeResponse{}, nil
}

func (n *node) NodeUnpublishVolume(ctx context.Context, r *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	for syscall.Unmount(r.TargetPath, 0) == nil {
	}
	os.Remove(r.TargetPath)
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

func main() {
	os.MkdirAll(filepath.Dir(os.Args[1]), 0755)
	os.Remove(os.Args[1])
	l, err := net.Listen("unix", os.Args[1])
	if err != nil {
		panic(err)
	}
	s := grpc.NewServer()
	csipb.RegisterNodeServer(s, &node{source: os.Args[2]})
	s.Serve(l)
}
