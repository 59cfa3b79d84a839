package e2b

import (
	"context"
	"net/http"
)

// E2B's Volume API (POST /volumes, GET /volumes, GET and DELETE
// /volumes/{volumeID}) over the server's volumes (/v1/volumes): a
// volume's volumeID is its name, which its owner's sandboxes mount with
// volumeMounts. Volumes are made at the server's default size. The
// answers carry no content token: E2B's volume content API
// (/volumecontent/...) is not served; the server's
// /v1/volumes/{name}/files is its equivalent.

// VolumeBackend is implemented by a Backend that keeps volumes; without
// it the routes answer 501.
type VolumeBackend interface {
	CreateVolume(ctx context.Context, owner, name string) error
	Volumes(ctx context.Context, owner string) ([]string, error)
	// Volume is nil when owner has volume name.
	Volume(ctx context.Context, owner, name string) error
	DeleteVolume(ctx context.Context, owner, name string) error
}

// volumeJSON is E2B's Volume; volumeAndTokenJSON its VolumeAndToken.
type volumeJSON struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

type volumeAndTokenJSON struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token"`
}

func (h *Handler) volumes() (VolumeBackend, error) {
	v, ok := h.backend.(VolumeBackend)
	if !ok {
		return nil, &statusError{http.StatusNotImplemented, "this server keeps no volumes"}
	}
	return v, nil
}

func (h *Handler) createVolume(w http.ResponseWriter, r *http.Request, owner string) error {
	vb, err := h.volumes()
	if err != nil {
		return err
	}
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if err := vb.CreateVolume(r.Context(), owner, req.Name); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, volumeAndTokenJSON{VolumeID: req.Name, Name: req.Name})
	return nil
}

func (h *Handler) listVolumes(w http.ResponseWriter, r *http.Request, owner string) error {
	vb, err := h.volumes()
	if err != nil {
		return err
	}
	names, err := vb.Volumes(r.Context(), owner)
	if err != nil {
		return err
	}
	out := make([]volumeJSON, 0, len(names))
	for _, n := range names {
		out = append(out, volumeJSON{VolumeID: n, Name: n})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) getVolume(w http.ResponseWriter, r *http.Request, owner string) error {
	vb, err := h.volumes()
	if err != nil {
		return err
	}
	id := r.PathValue("volumeID")
	if err := vb.Volume(r.Context(), owner, id); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, volumeAndTokenJSON{VolumeID: id, Name: id})
	return nil
}

func (h *Handler) deleteVolume(w http.ResponseWriter, r *http.Request, owner string) error {
	vb, err := h.volumes()
	if err != nil {
		return err
	}
	if err := vb.DeleteVolume(r.Context(), owner, r.PathValue("volumeID")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
