package api

import "time"

// Template is a built template (GET /v1/templates; schema Template).
type Template struct {
	Name         string    `json:"name"`
	SizeBytes    int64     `json:"size_bytes"`
	CreatedAt    time.Time `json:"created_at"`
	BuildSeconds float64   `json:"build_seconds,omitempty"`
	Hash         string    `json:"hash,omitempty"` // of a Dockerfile build's inputs
	Runtime      string    `json:"runtime"`
	From         string    `json:"from,omitempty"`
	Start        string    `json:"start,omitempty"` // LABEL sheepfold.start
	Ready        string    `json:"ready,omitempty"` // LABEL sheepfold.ready
}

// TemplateList is GET /v1/templates's answer (schema TemplateList).
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// TemplateBuild is a template build from a Dockerfile (POST /v1/templates,
// GET /v1/templates/builds/{id}; schema TemplateBuild).
type TemplateBuild struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Status    string     `json:"status"`         // TemplateBuild*
	Step      string     `json:"step,omitempty"` // what it is doing
	Done      int        `json:"done"`           // of Total, on one scale for the whole build
	Total     int        `json:"total"`
	Error     string     `json:"error,omitempty"` // a failed build's: the step, its command and last output
	Template  *Template  `json:"template,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

// TemplateBuild.Status values.
const (
	TemplateBuildRunning = "running"
	TemplateBuildDone    = "done"
	TemplateBuildFailed  = "failed"
)
