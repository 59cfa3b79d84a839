//go:build linux

package kubernetes

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sheepfold/sheepfold/internal/runtime"
)

// Persistent volumes (runtime.Volumes) as PersistentVolumeClaims.
//
// Each volume is one PersistentVolumeClaim named by the volume's id, of
// Config.StorageClass (the cluster's default when empty), asking for the
// volume's size, with access mode Config.VolumeAccessMode (ReadWriteOnce:
// the Pods of one node). Its storage outlives every Pod that mounted it;
// RemoveVolume deletes the claim, and what becomes of the storage is the
// StorageClass's reclaim policy. A sandbox's Pod mounts each of its
// volumes at the path asked, read-only where asked (the claim's volume
// source and the container's mount both say so: the kernel refuses
// writes), and the agent makes the root of each read-write one the
// sandbox user's before it serves when it is still root's (a fresh
// volume: `init --own-volume`), so that the code, uid 1000, writes it.
//
// What the runtime does not do itself: measure a volume (its use is on
// the node that mounts it, or the storage's: VolumeUsage says
// ErrUnsupported) or reach its files from the host (no
// runtime.VolumeOpener). The engine does both through an attendant, a
// Pod made by Create like a sandbox's that mounts the claim alone
// (internal/sandbox attendant.go). The size is the claim's request,
// which the provisioner's storage enforces or not (a hostPath or local
// volume does not); where it does not, the engine's measurements bound
// it (docs/security.md, 12.1). The engine's one-writer rule holds among
// the sandboxes of one replica; across replicas the claim's access mode
// is the bound (ReadWriteOnce: a Pod on a second node waits for the
// first to go).

// LabelVolume is the label of a volume's claim: its id.
const LabelVolume = "sheepfold.dev/volume"

// DefaultVolumeAccessMode is Config.VolumeAccessMode's default.
const DefaultVolumeAccessMode = corev1.ReadWriteOnce

var _ runtime.Volumes = (*Runtime)(nil)

// claim is the PersistentVolumeClaim of volume id.
func (r *Runtime) claim(id string, size int64) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{
			LabelManagedBy: managedBy, LabelInstance: r.cfg.Instance, LabelVolume: id,
		}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{r.cfg.VolumeAccessMode},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI),
			}},
		},
	}
	if r.cfg.StorageClass != "" {
		c.Spec.StorageClassName = ptr(r.cfg.StorageClass)
	}
	return c
}

// MakeVolume implements runtime.Volumes: a PersistentVolumeClaim of size
// bytes. One that exists already (a retry) is no error.
func (r *Runtime) MakeVolume(ctx context.Context, id string, size int64) error {
	if msgs := validLabel(id); msgs != "" {
		return fmt.Errorf("kubernetes: volume id %q: %s", id, msgs)
	}
	if size <= 0 {
		return fmt.Errorf("kubernetes: volume %s: size %d is not positive", id, size)
	}
	_, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Create(ctx, r.claim(id, size), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubernetes: create the volume's claim: %w", err)
	}
	return nil
}

// RemoveVolume implements runtime.Volumes: the claim goes (once no Pod
// uses it: the cluster's pvc-protection), and its storage as the
// StorageClass's reclaim policy says.
func (r *Runtime) RemoveVolume(ctx context.Context, id string) error {
	if err := ignoreNotFound(r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Delete(ctx, id, metav1.DeleteOptions{})); err != nil {
		return fmt.Errorf("kubernetes: delete the volume's claim: %w", err)
	}
	return nil
}

// VolumeUsage implements runtime.Volumes: ErrVolumeNotFound without the
// claim, ErrUnsupported otherwise (a claim's use is measured where it is
// mounted, not through the API: by the engine's attendant).
func (r *Runtime) VolumeUsage(ctx context.Context, id string) (int64, int64, error) {
	_, err := r.cs.CoreV1().PersistentVolumeClaims(r.cfg.Namespace).Get(ctx, id, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return 0, 0, runtime.ErrVolumeNotFound
	case err != nil:
		return 0, 0, fmt.Errorf("kubernetes: read the volume's claim: %w", err)
	}
	return 0, 0, fmt.Errorf("%w: a Pod's volume is not measured through the API", runtime.ErrUnsupported)
}

// podVolumes are the volumes and mounts of spec's persistent volumes, and
// the agent's arguments that give the read-write ones to the user.
func podVolumes(spec runtime.Spec) (vols []corev1.Volume, mounts []corev1.VolumeMount, args []string) {
	for i, v := range spec.Volumes {
		name := "volume-" + strconv.Itoa(i)
		vols = append(vols, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.ID, ReadOnly: v.ReadOnly},
		}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: v.Path, ReadOnly: v.ReadOnly})
		if !v.ReadOnly {
			args = append(args, "--own-volume", v.Path)
		}
	}
	return vols, mounts, args
}
