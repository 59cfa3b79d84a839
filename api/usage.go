package api

import "time"

// UsageFigures are metered usage with its estimated cost (schema
// UsageFigures): one group's of a report, or the total's.
type UsageFigures struct {
	SandboxSeconds    float64 `json:"sandbox_seconds"`
	CPUSeconds        float64 `json:"cpu_seconds"`
	GBSecondsReserved float64 `json:"gb_seconds_reserved"`
	GBSecondsUsed     float64 `json:"gb_seconds_used"`
	DiskPeakBytes     int64   `json:"disk_peak_bytes"`
	Executions        int64   `json:"executions"`
	Commands          int64   `json:"commands"`
	EgressRequests    int64   `json:"egress_requests"`  // through the egress gateway
	EgressBytesIn     int64   `json:"egress_bytes_in"`  // carried by the egress gateway to the sandbox
	EgressBytesOut    int64   `json:"egress_bytes_out"` // and from it
	// StorageGBSeconds is what the account kept in the server's
	// database over time (in the total, and in groups by hour or day).
	StorageGBSeconds float64 `json:"storage_gb_seconds"`
	// PausedGBSeconds is what paused sandboxes' checkpoints and kept
	// disks held over time, charged at the storage price.
	PausedGBSeconds float64 `json:"paused_gb_seconds"`
	// DeviceSeconds are the seconds sandboxes held devices (GPUs),
	// summed over their devices.
	DeviceSeconds float64 `json:"device_seconds"`
	CostMicros    int64   `json:"cost_micros"`
	Cost          string  `json:"cost"`
}

// StorageFigures are an account's storage in a usage report (schema
// UsageReport.storage).
type StorageFigures struct {
	GBSeconds float64 `json:"gb_seconds"`
	// VolumesGBSeconds is the account's volumes' share of GBSeconds (at
	// their sizes).
	VolumesGBSeconds float64 `json:"volumes_gb_seconds"`
	// SnapshotsGBSeconds is the account's snapshots' share of GBSeconds
	// (at the bytes they hold on the servers' disks).
	SnapshotsGBSeconds float64 `json:"snapshots_gb_seconds"`
	CostMicros         int64   `json:"cost_micros"`
	Cost               string  `json:"cost"`
}

// UsageGroup is one group of a usage report: an hour, a day, a sandbox
// or a template (schema UsageGroup).
type UsageGroup struct {
	Key       string `json:"key"` // a day, an hour, a sandbox id or a template
	Template  string `json:"template,omitempty"`
	SandboxID string `json:"sandbox_id,omitempty"`
	UsageFigures
}

// Prices are the operator's price table, in micro-units of its currency
// (schema Prices).
type Prices struct {
	CPUSecondMicros    float64 `json:"cpu_second_micros"`
	GBSecondMicros     float64 `json:"gb_second_micros"`
	ExecutionMicros    float64 `json:"execution_micros"`
	StorageGBSecond    float64 `json:"storage_gb_second_micros"` // records kept in the server's database
	DeviceSecondMicros float64 `json:"device_second_micros"`     // a second of one device held
}

// UsageReport is an account's usage in [From, To), grouped by GroupBy:
// the groups in key order, their total, the prices, the account's
// storage and its model tokens (GET /v1/account/usage; schema
// UsageReport).
type UsageReport struct {
	From    time.Time    `json:"from"`
	To      time.Time    `json:"to"`
	GroupBy string       `json:"group_by"`
	Groups  []UsageGroup `json:"groups"`
	Total   UsageFigures `json:"total"`
	Prices  Prices       `json:"prices"`
	// Storage is what the account kept in the server's database in the
	// period (its records), in Total too.
	Storage StorageFigures `json:"storage"`
	// Model tokens in the period; TokensLimit is the configured models'
	// monthly quotas summed (nil: some model has none).
	TokensUsed  int64        `json:"tokens_used"`
	TokensLimit *int64       `json:"tokens_limit"`
	Models      []ModelUsage `json:"models"`
}

// ModelUsage is an account's tokens of one model, with the model's
// monthly quota (nil: none) (schema ModelUsage).
type ModelUsage struct {
	Model            string `json:"model"`
	Requests         int64  `json:"requests"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	TotalTokens      int64  `json:"total_tokens"`
	MonthlyLimit     *int64 `json:"monthly_limit"`
	CostMicros       int64  `json:"cost_micros"`
	Cost             string `json:"cost"`
}

// SandboxUsage is one sandbox's usage; Live while it runs (GET
// /v1/sandboxes/{id}/usage; schema SandboxUsage).
type SandboxUsage struct {
	SandboxID string `json:"sandbox_id"`
	Template  string `json:"template"`
	Live      bool   `json:"live"`
	UsageFigures
}

// Credits are an account's credits in micro-units of the operator's
// currency (schema Credits); BalanceMicros is the ledger's sum.
type Credits struct {
	Balance        string `json:"balance"`
	BalanceMicros  int64  `json:"balance_micros"`
	FreeLeftMicros int64  `json:"free_left_micros"`
	FreeMicros     int64  `json:"free_micros"`
	GrantedMicros  int64  `json:"granted_micros"`
	SpentMicros    int64  `json:"spent_micros"`
	// PendingMicros is cost metered and not yet written to the ledger
	// (it is at the next flush); AvailableMicros = BalanceMicros -
	// PendingMicros.
	PendingMicros   int64 `json:"pending_micros"`
	AvailableMicros int64 `json:"available_micros"`
	Enforced        bool  `json:"enforced"`
}

// AccountStorage is what an account keeps in the server's database:
// records and bytes (a record's text plus 128) in all, and by kind
// ("sandboxes", "executions", "events", "alerts", "deliveries") with the
// most the account may keep of each (0: no bound) (schema
// AccountStorage).
type AccountStorage struct {
	Records int64                   `json:"records"`
	Bytes   int64                   `json:"bytes"`
	Kinds   map[string]StoredAmount `json:"kinds"`
}

// StoredAmount is one kind of an account's records and its bounds
// (schema StoredAmount).
type StoredAmount struct {
	Records    int64 `json:"records"`
	Bytes      int64 `json:"bytes"`
	MaxRecords int64 `json:"max_records"`
	MaxBytes   int64 `json:"max_bytes"`
}

// AccountKey is a key of an account, never its secret (schema
// AccountKey).
type AccountKey struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Alert is an alert of an account (schema Alert).
type Alert struct {
	ID             string     `json:"id"`
	Severity       string     `json:"severity"` // low, medium, high, critical
	Kind           string     `json:"kind"`     // manual, quota, credits, security_violation
	Message        string     `json:"message"`
	SandboxID      string     `json:"sandbox_id,omitempty"`
	SessionID      string     `json:"session_id,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	Acknowledged   bool       `json:"acknowledged"`
	AcknowledgedAt *time.Time `json:"acknowledged_at,omitempty"`
}

// MonthUsage is an account's usage this month, which its quotas count
// (schema MonthUsage).
type MonthUsage struct {
	Start   time.Time    `json:"start"`
	ResetAt time.Time    `json:"reset_at"`
	Usage   MonthFigures `json:"usage"`
}

// MonthFigures are what an account's monthly quotas count (schema
// MonthUsage.usage).
type MonthFigures struct {
	SandboxSeconds float64 `json:"sandbox_seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	GBSeconds      float64 `json:"gb_seconds"` // memory reserved (limit × time)
	Executions     int64   `json:"executions"`
}

// AccountLimits are an account's limits (schema AccountLimits). In
// Account.Limits every field is set (0 means unlimited); in
// Account.Overrides and a request that sets them only the account's own
// ones are: nil takes (or keeps) the server's default.
type AccountLimits struct {
	MaxSandboxes          *int64   `json:"max_sandboxes,omitempty"`
	RequestsPerMinute     *int64   `json:"requests_per_minute,omitempty"`
	ExecutionsPerMinute   *int64   `json:"executions_per_minute,omitempty"`
	MonthlySandboxSeconds *int64   `json:"monthly_sandbox_seconds,omitempty"`
	MonthlyCPUSeconds     *int64   `json:"monthly_cpu_seconds,omitempty"`
	MonthlyGBSeconds      *int64   `json:"monthly_gb_seconds,omitempty"`
	MonthlyExecutions     *int64   `json:"monthly_executions,omitempty"`
	MaxCPUs               *float64 `json:"max_cpus,omitempty"`
	MaxMemoryMB           *int64   `json:"max_memory_mb,omitempty"`
	MaxDiskMB             *int64   `json:"max_disk_mb,omitempty"`
	MaxTimeout            *int64   `json:"max_timeout,omitempty"` // seconds
	// MaxDevices bounds the devices (GPUs, CDI devices) the account's
	// live sandboxes hold at once.
	MaxDevices *int64 `json:"max_devices,omitempty"`
}

// Account is an account as the server describes it (schema Account).
type Account struct {
	ID               string          `json:"id"`
	Name             string          `json:"name"`
	CreatedAt        time.Time       `json:"created_at"`
	Limits           AccountLimits   `json:"limits"`
	Overrides        AccountLimits   `json:"overrides"`
	RunningSandboxes int64           `json:"running_sandboxes"`
	Month            MonthUsage      `json:"month"`
	Credits          *Credits        `json:"credits,omitempty"`
	Storage          *AccountStorage `json:"storage,omitempty"`
	Keys             []AccountKey    `json:"keys,omitempty"`
	// Runtime is the default runtime of the account's sandboxes ("" the
	// server's), RuntimeLocked whether it is their only one.
	Runtime       string `json:"runtime,omitempty"`
	RuntimeLocked bool   `json:"runtime_locked,omitempty"`
}

// CreateAlert raises an alert on the caller's account (POST /v1/alerts;
// schema CreateAlert).
type CreateAlert struct {
	Severity  string `json:"severity"` // low, medium, high or critical
	Message   string `json:"message"`
	SandboxID string `json:"sandbox_id,omitempty"`
	SessionID string `json:"session_id,omitempty"`
}

// CreateKey creates a key of an account (POST /v1/admin/keys; schema
// CreateKey).
type CreateKey struct {
	Account string `json:"account"` // the account's name or id
	Name    string `json:"name,omitempty"`
	Admin   bool   `json:"admin,omitempty"`
	E2B     bool   `json:"e2b,omitempty"`
}

// NewKey is a created key; Key is its secret, shown only here (schema
// NewKey). Its fields stand in the order of their names, as the server
// has always sent them.
type NewKey struct {
	Account   string    `json:"account"`
	AccountID string    `json:"account_id"`
	CreatedAt time.Time `json:"created_at"`
	ID        string    `json:"id"`
	Key       string    `json:"key"`
	Name      string    `json:"name"`
	Role      string    `json:"role"`
}
