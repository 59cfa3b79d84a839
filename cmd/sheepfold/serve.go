package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sheepfold/sheepfold/internal/account"
	"github.com/sheepfold/sheepfold/internal/apierr"
	"github.com/sheepfold/sheepfold/internal/bound"
	"github.com/sheepfold/sheepfold/internal/config"
	"github.com/sheepfold/sheepfold/internal/egress"
	sfengine "github.com/sheepfold/sheepfold/internal/engine"
	"github.com/sheepfold/sheepfold/internal/events"
	"github.com/sheepfold/sheepfold/internal/identity"
	"github.com/sheepfold/sheepfold/internal/llm"
	"github.com/sheepfold/sheepfold/internal/metering"
	"github.com/sheepfold/sheepfold/internal/preview"
	"github.com/sheepfold/sheepfold/internal/runtime/kubernetes"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/sandbox"
	"github.com/sheepfold/sheepfold/internal/secrets"
	"github.com/sheepfold/sheepfold/internal/server"
	"github.com/sheepfold/sheepfold/internal/store"
	"github.com/sheepfold/sheepfold/internal/store/postgres"
	"github.com/sheepfold/sheepfold/internal/template"
	"github.com/sheepfold/sheepfold/internal/webhooks"
)

func serveCmd(cfg *config.Config) *cobra.Command {
	var (
		listen        string
		uploadMB      int64
		maxSandboxes  int
		maxPaused     int
		maxSnapshots  int
		maxSnapPool   int
		logFormat     string
		previewDomain string
		metricsListen string
	)
	var autoPauseNotice time.Duration
	var gpuClass string
	var shareDevices bool
	var maxPausedMB, maxSnapshotMB int64
	var idleTimeout, eventRetention, retention, stoppedRetention, shutdownTimeout, drainDelay time.Duration
	var webhookHosts, webhookCIDRs []string
	var streamsPerKey, streamsPerAccount, maxStreams, maxConns, uiSessions, pacePerAccount int
	overcommit := 2.0
	poolSize := sandbox.DefaultPoolSize()
	var poolMax int
	var poolMemoryMB int64
	var poolShrink time.Duration
	var poolTemplates []string
	startTimeout := sandbox.DefaultStartTimeout
	var eventRate sandbox.EventRate
	instance := ""
	configPath := ""
	backend := "local"
	var kube sfengine.KubernetesOptions
	var kubeImages, kubeServerPods, kubeRuntimeClasses map[string]string
	var kubeConnect string
	podFirewall := true
	var (
		freeCredits, creditsLow string
		acfg                    account.Config
		mcfg                    metering.Config
		prices                  = metering.DefaultPrices
		noAccounting            bool
		limits                  *limitFlags
		storage                 *storageFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the REST API (/v1) on --listen",
		Long: `Serve the REST API. Start order: configuration, database (--database: DATA_DIR/sheepfold.db
or a postgres:// URL several servers may share),
engine, HTTP. SIGINT or SIGTERM drains: /readyz answers 503 from the first
moment while every request is still served for --drain-delay (so that load
balancers stop sending new ones; skipped when nothing has asked /readyz),
then the listener closes and requests in flight may finish (up to
--shutdown-timeout; those cut off then get ERR_SHUTTING_DOWN, streams as
their last event), then every sandbox is stopped and the database closed.

Requests need an API key: create one with ` + "`sheepfold keys create`" + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configPath == "" {
				configPath = os.Getenv("SHEEPFOLD_CONFIG")
			}
			if _, err := applyConfig(cmd.Flags(), configPath, os.Getenv); err != nil {
				return err
			}
			if err := cfg.ResolveDataDir(); err != nil {
				return err
			}
			verbose, _ := cmd.Flags().GetBool("verbose")
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			opts := &slog.HandlerOptions{Level: level}
			var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
			switch logFormat {
			case "text":
			case "json":
				h = slog.NewJSONHandler(os.Stderr, opts)
			default:
				return fmt.Errorf("--log-format must be text or json, not %q", logFormat)
			}
			if err := preview.CheckDomain(previewDomain); err != nil {
				return fmt.Errorf("--preview-domain: %w", err)
			}
			if cfg.PublicURL != "" {
				if _, err := identity.CheckIssuer(cfg.PublicURL); err != nil {
					return fmt.Errorf("--public-url: %w", err)
				}
			}
			if uploadMB <= 0 {
				return errors.New("--file-size-upload-mb must be positive")
			}
			if err := webhooks.CheckCIDRs(webhookCIDRs); err != nil {
				return fmt.Errorf("--webhook-allow-cidr: %w", err)
			}
			if poolSize < 0 {
				return errors.New("--pool must not be negative")
			}
			if !cmd.Flags().Changed("pool-max") {
				poolMax = 4 * poolSize
			}
			if instance == "" {
				instance = serverInstance(cfg.DataDir)
			}
			if eventRetention <= 0 || retention <= 0 || stoppedRetention <= 0 || shutdownTimeout <= 0 {
				return errors.New("--event-retention, --retention, --stopped-retention and --shutdown-timeout must be positive")
			}
			bounds, err := storage.bounds()
			if err != nil {
				return err
			}
			if drainDelay < 0 {
				return errors.New("--drain-delay must not be negative")
			}
			if overcommit <= 0 {
				return errors.New("--overcommit must be positive")
			}
			if err := checkFlags(
				bound.Int("--file-size-upload-mb", uploadMB, 1, bound.MaxMB),
				bound.Int("--max-sandboxes", int64(maxSandboxes), 0, bound.MaxSandboxes),
				bound.Int("--max-paused-per-account", int64(maxPaused), 0, bound.MaxSandboxes),
				bound.Int("--max-snapshots-per-account", int64(maxSnapshots), 1, bound.MaxSandboxes),
				bound.Int("--max-snapshot-pool-per-account", int64(maxSnapPool), 0, bound.MaxSandboxes),
				bound.Int("--max-paused-mb-per-account", maxPausedMB, 0, bound.MaxMB),
				bound.Int("--max-snapshot-mb-per-account", maxSnapshotMB, 0, bound.MaxMB),
				bound.Int("--pool", int64(poolSize), 0, bound.MaxSandboxes),
				bound.Int("--pool-max", int64(poolMax), 0, bound.MaxSandboxes),
				bound.Int("--pool-memory-mb", poolMemoryMB, 0, bound.MaxMB),
				bound.Duration("--pool-shrink-after", poolShrink, 0, bound.MaxDuration),
				bound.Duration("--idle-timeout", idleTimeout, 0, bound.MaxDuration),
				bound.Duration("--auto-pause-notice", autoPauseNotice, time.Second, bound.MaxDuration),
				bound.Duration("--event-retention", eventRetention, 0, bound.MaxDuration),
				bound.Duration("--retention", retention, 0, bound.MaxDuration),
				bound.Duration("--stopped-retention", stoppedRetention, 0, bound.MaxDuration),
				bound.Int("--sandbox-event-burst", int64(eventRate.Burst), 1, bound.MaxRate),
				bound.Int("--sandbox-events-per-minute", eventRate.PerMinute, 1, bound.MaxRate),
				bound.Duration("--shutdown-timeout", shutdownTimeout, 0, bound.MaxDuration),
				bound.Duration("--drain-delay", drainDelay, 0, bound.MaxDuration),
				bound.Int("--max-streams-per-key", int64(streamsPerKey), 0, bound.MaxCount),
				bound.Int("--max-streams-per-account", int64(streamsPerAccount), 0, bound.MaxCount),
				bound.Int("--max-streams", int64(maxStreams), 0, bound.MaxCount),
				bound.Int("--max-connections", int64(maxConns), 0, bound.MaxCount),
				bound.Int("--ui-sessions-per-account", int64(uiSessions), 1, bound.MaxCount),
				bound.Int("--pace-per-account", int64(pacePerAccount), 0, bound.MaxRate),
				bound.Duration("--credits-grace", acfg.CreditsGrace, 0, bound.MaxDuration),
				bound.Duration("--metering-flush-interval", mcfg.FlushInterval, 0, bound.MaxDuration),
				bound.Duration("--metering-sample-interval", mcfg.SampleInterval, 0, 10*time.Second),
				bound.Float("--overcommit", overcommit, 0, maxOvercommit),
				bound.Float("--price-cpu-second", prices.CPUSecond, 0, bound.MaxPrice),
				bound.Float("--price-gb-second", prices.GBSecond, 0, bound.MaxPrice),
				bound.Float("--price-execution", prices.Execution, 0, bound.MaxPrice),
				bound.Float("--price-storage-gb-second", prices.StorageGBSecond, 0, bound.MaxPrice),
				bound.Float("--price-device-second", prices.DeviceSecond, 0, bound.MaxPrice),
			); err != nil {
				return err
			}
			if err := webhooks.CheckHosts(webhookHosts); err != nil {
				return fmt.Errorf("--webhook-allow-hosts: %w", err)
			}
			eopt, err := egressOptions(cmd.Flags())
			if err != nil {
				return err
			}
			def, err := limits.overrides(cmd.Flags())
			if err != nil {
				return err
			}
			acfg.Defaults = def.Apply(account.Limits{})
			if freeCredits != "" {
				if acfg.FreeCreditsMicros, err = account.ParseAmount(freeCredits); err != nil {
					return fmt.Errorf("--free-credits: %w", err)
				}
			}
			if acfg.CreditsLowMicros, err = account.ParseAmount(creditsLow); err != nil || acfg.CreditsLowMicros <= 0 {
				return errors.New("--credits-low must be a positive amount such as 1.00")
			}
			// Servers sharing a PostgreSQL count caps and quotas there too.
			acfg.SharedStore = postgres.IsURL(cfg.Database)
			if err := acfg.Validate(); err != nil {
				return err
			}
			if prices.CPUSecond < 0 || prices.GBSecond < 0 || prices.Execution < 0 {
				return errors.New("--price-* must not be negative")
			}
			mcfg.Prices = &prices
			providers, err := readProviders(configPath)
			if err != nil {
				return err
			}
			var relay *llm.Relay
			if len(providers) > 0 {
				if relay, err = llm.New(providers, os.Getenv); err != nil {
					return fmt.Errorf("config file: %w", err)
				}
				relay.SetLogger(slog.New(h))
			}
			var ko *sfengine.KubernetesOptions
			switch backend {
			case "local":
			case "kubernetes":
				if kube.Config.Namespace == "" {
					return errors.New("--backend kubernetes needs --kubernetes-namespace")
				}
				kube.Config.Images, kube.Config.ServerPods = kubeImages, kubeServerPods
				kube.Config.OpenNetwork = !podFirewall
				switch kubeConnect {
				case "pod-ip":
				case "port-forward":
					kube.PortForward = true
				default:
					return fmt.Errorf("--kubernetes-connect must be pod-ip or port-forward, not %q", kubeConnect)
				}
				kube.Config.RuntimeClasses = kubeRuntimeClasses
				ko = &kube
			default:
				return fmt.Errorf("--backend must be local or kubernetes, not %q", backend)
			}
			return serve(cmd.Context(), *cfg, ko, listen, metricsListen, server.Config{
				MaxUploadBytes: uploadMB << 20, MaxSandboxes: maxSandboxes, MaxPausedPerAccount: maxPaused, MaxSnapshotsPerAccount: maxSnapshots, MaxSnapshotPoolPerAccount: maxSnapPool, MaxPausedBytesPerAccount: maxPausedMB << 20, MaxSnapshotBytesPerAccount: maxSnapshotMB << 20, Version: version, Retention: retention,
				StoppedRetention: stoppedRetention, Storage: bounds,
				WebhookAllowHosts: webhookHosts, WebhookAllowCIDRs: webhookCIDRs, Accounts: acfg, Metering: mcfg, NoAccounting: noAccounting,
				HostMemoryBytes: sandbox.HostMemory(), Overcommit: overcommit, ShutdownTimeout: shutdownTimeout,
				Models: relay, PreviewDomain: previewDomain,
				MaxStreamsPerKey: noBound(streamsPerKey), MaxStreamsPerAccount: noBound(streamsPerAccount),
				MaxStreams: maxStreams, MaxConnections: maxConns, UISessionsPerAccount: uiSessions, DrainDelay: noDelay(drainDelay),
				PacePerAccount: noBound(pacePerAccount),
			}, events.BusConfig{Retention: eventRetention}, idleTimeout, slog.New(h), instance,
				func(c *sandbox.Config) {
					c.PoolSize, c.PoolMax, c.PoolMemory, c.PoolShrinkAfter = poolSize, poolMax, poolMemoryMB<<20, poolShrink
					c.PoolTemplates = poolTemplates
					c.StartTimeout = startTimeout
					c.AutoPauseNotice = autoPauseNotice
					c.GPUClass, c.ShareDevices = gpuClass, shareDevices
					c.EventRate = eventRate
					c.Egress.MaxFlows, c.Egress.IdleTimeout, c.Egress.Rate = eopt.MaxFlows, eopt.IdleTimeout, eopt.Rate
					if maxSandboxes > 0 {
						// The engine's own cap follows, so that the flag
						// can raise the default as well as lower it.
						c.MaxSandboxes = maxSandboxes
					}
				})
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "config file: TOML whose keys are these flags' names, plus [[providers]] tables of model providers (default: $SHEEPFOLD_CONFIG, else "+DefaultConfigFile+" if it exists); the environment (SHEEPFOLD_<FLAG>) overrides it and flags override both")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on")
	cmd.Flags().StringVar(&backend, "backend", backend, "where sandboxes run: local (runc on this host) or kubernetes (a Pod each; --kubernetes-*)")
	cmd.Flags().StringVar(&kube.Kubeconfig, "kubeconfig", "", "with --backend kubernetes: the cluster's kubeconfig (default: the Pod's in-cluster service account)")
	cmd.Flags().StringVar(&kube.Config.Namespace, "kubernetes-namespace", "", "with --backend kubernetes: the namespace of the sandboxes' Pods, Secrets and NetworkPolicies")
	cmd.Flags().StringVar(&kube.Config.Instance, "kubernetes-instance", "sheepfold", "with --backend kubernetes: the name every replica of this deployment shares (labels, the agents' authority)")
	cmd.Flags().StringToStringVar(&kubeImages, "kubernetes-image", nil, "with --backend kubernetes: TEMPLATE=IMAGE, the image of each template (sheepfold template export)")
	cmd.Flags().StringVar(&kube.Config.RuntimeClass, "kubernetes-runtime-class", "", "with --backend kubernetes: the Pods' RuntimeClass, e.g. runc or gvisor (default: the cluster's)")
	cmd.Flags().StringToStringVar(&kubeRuntimeClasses, "kubernetes-runtime-classes", nil, `with --backend kubernetes: NAME=RUNTIMECLASS, the runtimes a create request may choose ("runtime": NAME), e.g. gvisor=gvisor,runc=runc (default: none; every Pod gets --kubernetes-runtime-class)`)
	cmd.Flags().StringSliceVar(&kube.Config.HostUsersRuntimes, "kubernetes-host-users-runtimes", []string{"gvisor"}, "with --backend kubernetes: runtimes (names in --kubernetes-runtime-classes, or RuntimeClasses) whose Pods run in the node's user namespace (gVisor's cannot join a Pod's own)")
	cmd.Flags().StringSliceVar(&kube.Config.OpenNetworkRuntimes, "kubernetes-open-network-runtimes", []string{"gvisor"}, "with --backend kubernetes: runtimes (as --kubernetes-host-users-runtimes) whose Pods get no Pod firewall (gVisor's netstack has no nftables): their NetworkPolicy alone closes them, which needs a CNI that enforces it")
	cmd.Flags().StringSliceVar(&kube.Config.NodePidsRuntimes, "kubernetes-node-pids-runtimes", []string{"gvisor"}, "with --backend kubernetes: runtimes (as --kubernetes-host-users-runtimes) whose tasks are not in their container's cgroup (gVisor's), so that the sandbox's pids limit (its containers' pids.max, from the NRI plugin) does not bound them: the kubelet's podPidsLimit alone does, and their agent checks no limit")
	cmd.Flags().StringVar(&kube.Config.StorageClass, "kubernetes-storage-class", "", "with --backend kubernetes: the StorageClass of the volumes' PersistentVolumeClaims (/v1/volumes: a claim each) (default: the cluster's default StorageClass)")
	cmd.Flags().StringVar((*string)(&kube.Config.VolumeAccessMode), "kubernetes-volume-access-mode", string(kubernetes.DefaultVolumeAccessMode), "with --backend kubernetes: the access mode of the volumes' claims: ReadWriteOnce (one node's Pods), ReadWriteOncePod or ReadWriteMany (a StorageClass that offers it)")
	cmd.Flags().StringVar(&kube.Config.GPUResource, "kubernetes-gpu-resource", kubernetes.DefaultGPUResource, "with --backend kubernetes: the extended resource a sandbox's GPUs (resources.gpu) are asked for by, which the nodes' device plugin allocates")
	cmd.Flags().BoolVar(&kube.Config.HostUsers, "kubernetes-host-users", false, "with --backend kubernetes: run Pods in the node's user namespace (for clusters without user namespaces; default: a user namespace per Pod)")
	cmd.Flags().StringVar(&kube.Config.SeccompProfile, "kubernetes-seccomp-profile", "sheepfold/agent.json", "with --backend kubernetes: the Pods' Localhost seccomp profile in each node's kubelet seccomp directory (write it with sheepfold seccomp-profile), or RuntimeDefault (code contexts cannot start under it)")
	cmd.Flags().Float32Var(&kube.QPS, "kubernetes-api-qps", sfengine.DefaultQPS, "with --backend kubernetes: the requests a second this replica sends the API server, sustained (client-go's default of 5 throttles a busy replica; waits over 250 ms are logged)")
	cmd.Flags().IntVar(&kube.Burst, "kubernetes-api-burst", sfengine.DefaultBurst, "with --backend kubernetes: how many requests may go to the API server at once above --kubernetes-api-qps")
	cmd.Flags().StringVar(&kubeConnect, "kubernetes-connect", "pod-ip", "with --backend kubernetes: how the server reaches agents: pod-ip (it must reach the pod network) or port-forward (through the API server, for a server outside the cluster)")
	cmd.Flags().BoolVar(&podFirewall, "kubernetes-pod-firewall", true, "with --backend kubernetes: an init container with NET_ADMIN closes each Pod's network to all but its agent's port, whatever the CNI plugin enforces; false leaves that to the NetworkPolicy (a CNI that enforces it, and a Pod Security admission that refuses NET_ADMIN)")
	cmd.Flags().StringToStringVar(&kubeServerPods, "kubernetes-server-pods", nil, "with --backend kubernetes: labels of the server's Pods, the only ones let in to agents (default: any source; TLS admits only the server)")
	cmd.Flags().Int64Var(&uploadMB, "file-size-upload-mb", 100, "largest file one upload may write, in MiB")
	cmd.Flags().IntVar(&maxPaused, "max-paused-per-account", 0, "most sandboxes each account keeps paused to disk at once (0: no bound)")
	cmd.Flags().IntVar(&maxSnapshots, "max-snapshots-per-account", server.DefaultMaxSnapshotsPerAccount, "most snapshots each account keeps")
	cmd.Flags().IntVar(&maxSnapPool, "max-snapshot-pool-per-account", 0, "most sandboxes each account keeps restored ahead in its snapshots' pools (POST /v1/snapshots/{name}/pool), all together; they hold memory while unused (0: no snapshot pools)")
	cmd.Flags().Int64Var(&maxSnapshotMB, "max-snapshot-mb-per-account", 0, "most MiB each account's snapshots keep on the server's disk (their size_bytes); a snapshot past it is refused with ERR_STORAGE_QUOTA_EXCEEDED, nothing of it kept, and the sandbox runs on (0: no bound)")
	cmd.Flags().Int64Var(&maxPausedMB, "max-paused-mb-per-account", 0, "most MiB each account's paused sandboxes keep on the server's disk (checkpoints and kept disks; a pause is counted at its memory and disk when it begins); a pause past it is refused with ERR_STORAGE_QUOTA_EXCEEDED and the sandbox runs on (0: no bound)")
	cmd.Flags().IntVar(&maxSandboxes, "max-sandboxes", 0, "most sandboxes running at once (0: the engine's default, "+strconv.Itoa(sandbox.DefaultMaxSandboxes)+")")
	cmd.Flags().DurationVar(&autoPauseNotice, "auto-pause-notice", sandbox.DefaultAutoPauseNotice,
		"how long before an auto_pause sandbox is paused the sandbox.pausing event is sent, and how long it must have been idle (no request, preview traffic or CPU use) to be paused")
	cmd.Flags().DurationVar(&idleTimeout, "idle-timeout", 10*time.Minute,
		"stop a sandbox after this long with no request and no CPU use (0: never)")
	cmd.Flags().DurationVar(&eventRetention, "event-retention", 7*24*time.Hour,
		"how long sandbox events and webhook deliveries are kept")
	cmd.Flags().DurationVar(&retention, "retention", 7*24*time.Hour,
		"how long records of stopped sandboxes and of executions are kept")
	cmd.Flags().DurationVar(&stoppedRetention, "stopped-retention", 24*time.Hour,
		"how long the executions of a stopped sandbox keep their code and output (the records stay until --retention)")
	storage = addStorageFlags(cmd.Flags())
	cmd.Flags().IntVar(&eventRate.Burst, "sandbox-event-burst", sandbox.DefaultEventBurst,
		"events of one kind a sandbox's code can cause (its reports, the egress gateway's refusals) let through at once; past it and --sandbox-events-per-minute they are coalesced into one event with their count")
	cmd.Flags().Int64Var(&eventRate.PerMinute, "sandbox-events-per-minute", sandbox.DefaultEventsPerMinute,
		"events of one kind a sandbox's code can cause let through a minute after the burst")
	cmd.Flags().StringSliceVar(&webhookHosts, "webhook-allow-hosts", nil,
		"the only hosts (name, *.domain) and CIDRs webhooks may deliver to (default: any public address); a name must still resolve to an address webhooks may reach")
	cmd.Flags().StringSliceVar(&webhookCIDRs, "webhook-allow-cidr", nil,
		"address ranges webhooks may reach although not public (loopback, private, CGNAT, reserved, the host's own), e.g. 127.0.0.0/8,10.1.0.0/16; link-local and cloud metadata addresses are never reached")
	cmd.Flags().DurationVar(&shutdownTimeout, "shutdown-timeout", 10*time.Second,
		"how long a shutdown waits for requests in flight before cutting them off")
	cmd.Flags().DurationVar(&drainDelay, "drain-delay", server.DefaultDrainDelay,
		"on SIGTERM, how long /readyz answers 503 while requests are still served, before the listener closes (0: none; skipped when nothing has asked /readyz)")
	cmd.Flags().IntVar(&streamsPerKey, "max-streams-per-key", server.DefaultMaxStreamsPerKey,
		"most streams (executions, event streams, downloads and uploads, previews, MCP calls, E2B streams and watchers) one API key may hold open at once; past it 429 ERR_TOO_MANY_CONNECTIONS (0: no bound)")
	cmd.Flags().IntVar(&streamsPerAccount, "max-streams-per-account", server.DefaultMaxStreamsPerAccount,
		"most streams all keys of one account may hold open at once (0: no bound)")
	cmd.Flags().IntVar(&maxStreams, "max-streams", 0,
		"most streams of all accounts together; past it 503 ERR_CAPACITY (0: from the file descriptor limit, leaving a quarter of it, at least 256, to health checks, the database and sandbox teardown)")
	cmd.Flags().IntVar(&maxConns, "max-connections", 0,
		"most client connections open: past it, a new one closes the oldest serving no request (kept alive between requests, or not yet sending one) (0: from the file descriptor limit, after the reserve and the streams)")
	cmd.Flags().IntVar(&pacePerAccount, "pace-per-account", server.DefaultPacePerAccount,
		"requests a second this server answers one account before its next requests wait their place (a tenth of a second's worth at once); a place more than 5s away is refused with 429 ERR_RATE_LIMITED (0: no pacing)")
	cmd.Flags().IntVar(&uiSessions, "ui-sessions-per-account", server.DefaultUISessionsPerAccount,
		"most dashboard sessions of one account: a login past it ends the account's oldest session")
	cmd.Flags().Float64Var(&overcommit, "overcommit", overcommit,
		"how many times the host's memory the sandboxes' memory limits (plus their disks where those are kept in memory) may add up to (sandboxes past it get 503 ERR_CAPACITY)")
	cmd.Flags().StringVar(&logFormat, "log-format", "text", "log format: text or json (one object a line; requests carry request_id, account and sandbox)")
	cmd.Flags().StringVar(&previewDomain, "preview-domain", server.DefaultPreviewDomain,
		"previews live on origins of their own, {port}-{sandbox id}.DOMAIN on --listen's port: a wildcard DNS name for this server outside the site (registrable domain) of the API's own name (the default, localhost, needs no DNS: browsers resolve *.localhost to the loopback); a Host under it never reaches the API, and the path form /v1/sandboxes/{id}/proxy/{port}/ sends browsers there")
	cmd.Flags().StringVar(&metricsListen, "metrics-listen", "",
		"also serve Prometheus /metrics without a key on this address (keep it private, e.g. 127.0.0.1:9464); on --listen, /metrics needs an admin key")
	cmd.Flags().IntVar(&poolSize, "pool", poolSize,
		"sandboxes of the python template kept started ahead, pandas, numpy and matplotlib imported (0: no warm pool; default: one per CPU, at most one per 2 GiB); with --backend kubernetes, on each node")
	cmd.Flags().IntVar(&poolMax, "pool-max", 0,
		"the most sandboxes one pool grows to on demand: a create that finds its pool empty grows it by one, a shape of resources asked for twice gets a pool of its own, and a pool unused for --pool-shrink-after goes back to --pool (default: 4 × --pool; --pool: a fixed pool)")
	cmd.Flags().Int64Var(&poolMemoryMB, "pool-memory-mb", 0,
		"memory the pools' sandboxes above --pool may take, all pools together, reckoning 128 MiB each (default: an eighth of the host's memory)")
	cmd.Flags().DurationVar(&poolShrink, "pool-shrink-after", 0,
		"how long a pool grown past --pool waits unused before it shrinks back (default 2m)")
	cmd.Flags().StringSliceVar(&poolTemplates, "pool-templates", nil,
		"the templates that have a warm pool, each of --pool sandboxes (default: python)")
	cmd.Flags().DurationVar(&startTimeout, "template-start-timeout", startTimeout,
		"how long a template's start command (LABEL sheepfold.start) may take to pass its ready check (LABEL sheepfold.ready) as a sandbox starts, before the create fails with ERR_TEMPLATE_NOT_READY")
	// The engine instance names the state directory and the cgroup
	// (sheepfold/<instance>) this server's sandboxes live in; a second
	// server on the same host (`sheepfold bench` starts one) needs its own,
	// or each would destroy the other's sandboxes as leftovers. The default
	// is derived from the data dir: a restarted server finds its own
	// leftovers, and servers of different data dirs stay apart.
	cmd.Flags().StringVar(&instance, "instance", "", "engine instance name: state directory and cgroup of this server's sandboxes (default: server-<hash of the data dir>)")
	cmd.Flags().MarkHidden("instance")
	cmd.Flags().StringVar(&cfg.SecretsKeyFile, "secrets-key-file", "", "the keys that seal the accounts' secrets: lines ID:BASE64 (32 bytes each, the last one seals, every one opens; mode 0600) (default: $"+secrets.KeyEnv+" in that format, else DATA_DIR/"+secrets.KeyFileName+", made with a new key at the first start)")
	cmd.Flags().StringVar(&cfg.PublicURL, "public-url", "", "the URL at which relying parties (a cloud's OIDC federation, your services) reach this server: the issuer of the sandboxes' workload identity tokens, served at /.well-known/openid-configuration and /.well-known/jwks.json; clouds want https (default: http://LISTEN, localhost for a wildcard address)")
	cmd.Flags().StringSliceVar(&cfg.BuildAllowHosts, "build-allow-host", config.DefaultBuildAllowHosts,
		"the hosts the RUN steps of template builds may reach, through an egress gateway that refuses every other (allowlist rules: host, *.domain, host:port; repeatable or comma-separated; \"\" for none: no network)")
	cmd.Flags().StringVar(&cfg.BuildCAFile, "build-ca-file", config.DefaultBuildCA(),
		"CA certificates the TLS clients of RUN steps trust besides the template's own (SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, ... name it inside the step; \"\": none)")
	cmd.Flags().StringSliceVar(&cfg.CDISpecDirs, "cdi-spec-dirs", config.DefaultCDISpecDirs,
		"directories of the host's CDI specs (the Container Device Interface: nvidia-ctk cdi generate and other vendors' tools write them), which describe the devices sandboxes may ask for (resources.gpu, resources.devices); empty: none")
	registryFlags(cmd.Flags(), cfg)
	cmd.Flags().StringVar(&gpuClass, "gpu-class", sandbox.DefaultGPUClass, "the CDI class (vendor/class) that resources.gpu draws devices from")
	cmd.Flags().BoolVar(&shareDevices, "share-devices", false, "let live sandboxes hold the same device (default: one sandbox per device; a create asking for a held one is refused with ERR_DEVICE_IN_USE)")
	cmd.Flags().StringVar(&cfg.DefaultRuntime, "default-runtime", "",
		`runtime of the sandboxes that name none ("runtime" of a create; the warm pool's): runc, or gvisor (gVisor's runsc, which make setup builds; a sandbox may ask for either) (default: runc)`)
	cmd.Flags().StringVar(&cfg.CgroupRoot, "cgroup-root", "",
		"cgroup under which sandboxes' cgroups are made, e.g. / for the hierarchy's root (default: on cgroup v2 under systemd, the service's own delegated cgroup (Delegate=yes); else /)")
	// Accounts: the default limits of every account (each may override
	// them: sheepfold accounts set-limits), credits and prices.
	limits = addLimitFlags(cmd.Flags(), "account-", "default per account: ")
	addEgressFlags(cmd.Flags())
	cmd.Flags().StringVar(&freeCredits, "free-credits", "", "credits a new account starts with, e.g. 5.00 (default: none)")
	cmd.Flags().BoolVar(&acfg.EnforceCredits, "enforce-credits", false,
		"refuse new sandboxes, executions and commands of accounts without credits, and stop their sandboxes after --credits-grace")
	cmd.Flags().DurationVar(&acfg.CreditsGrace, "credits-grace", 5*time.Minute, "how long sandboxes of an account without credits keep running")
	cmd.Flags().StringVar(&creditsLow, "credits-low", "1.00", "raise a \"credits low\" alert under this balance (with --enforce-credits)")
	cmd.Flags().StringVar(&acfg.SecurityAlertSeverity, "security-alert-severity", "high",
		"least severity of a security violation that raises an alert: low, medium, high, critical or none")
	cmd.Flags().Float64Var(&prices.CPUSecond, "price-cpu-second", prices.CPUSecond, "price of a CPU-second, in micro-units of your currency")
	cmd.Flags().Float64Var(&prices.GBSecond, "price-gb-second", prices.GBSecond, "price of a GB-second of memory reserved, in micro-units")
	cmd.Flags().Float64Var(&prices.Execution, "price-execution", prices.Execution, "price of an execution, in micro-units")
	cmd.Flags().Float64Var(&prices.DeviceSecond, "price-device-second", prices.DeviceSecond, "price of a second of one device (a GPU) held by a sandbox, in micro-units")
	cmd.Flags().Float64Var(&prices.StorageGBSecond, "price-storage-gb-second", prices.StorageGBSecond,
		"price of a GB-second of records an account keeps in the database (events, executions, alerts, deliveries), in micro-units")
	cmd.Flags().DurationVar(&mcfg.FlushInterval, "metering-flush-interval", 10*time.Second, "how often metered usage is written to the database (at most 10s)")
	cmd.Flags().DurationVar(&mcfg.SampleInterval, "metering-sample-interval", time.Second, "how often each sandbox's cgroup is sampled")
	cmd.Flags().BoolVar(&noAccounting, "no-accounting", false, "turn account limits, rate limits and metering off (benchmarks compare)")
	cmd.Flags().MarkHidden("no-accounting")
	return cmd
}

func serve(ctx context.Context, cfg config.Config, kube *sfengine.KubernetesOptions, listen, metricsListen string, scfg server.Config, bcfg events.BusConfig,
	idleTimeout time.Duration, log *slog.Logger, instance string, engineOpts ...func(*sandbox.Config)) (err error) {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	// 1. Configuration. Pods carry their agent in their image: only the
	// local backend needs the runtime and agent binaries.
	if kube == nil {
		if err := cfg.Resolve(); err != nil {
			return err
		}
	} else if err := cfg.ResolveDataDir(); err != nil {
		return err
	}
	// 2. The database: what was running before this start is gone (the
	// engine destroys leftovers), so it is recorded as stopped, and the
	// executions it was running as ended by the restart.
	st, err := openStore(ctx, &cfg)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := st.Close(); err == nil {
			err = cerr
		}
	}()
	// The accounts' secrets: values sealed under older keys of the
	// keyring are sealed again under its newest (key rotation).
	keys, err := secrets.LoadKeys(cfg.SecretsKeyFile, cfg.DataDir)
	if err != nil {
		return err
	}
	if cfg.SecretsKeyFile == "" && os.Getenv(secrets.KeyEnv) == "" && postgres.IsURL(cfg.Database) {
		log.Warn("secrets are sealed with this server's own key file: servers sharing the database must share it (--secrets-key-file or $"+secrets.KeyEnv+")",
			"file", filepath.Join(cfg.DataDir, secrets.KeyFileName))
	}
	if scfg.Secrets, err = secrets.New(st, keys, secrets.Options{}); err != nil {
		return err
	}
	// The gateways put the secrets their policies' rules name into
	// requests (internal/egress, inject.go).
	egressSecrets := server.NewEgressSecrets(st, scfg.Secrets, log)
	defer egressSecrets.Close() // after the engine: the last uses are written
	// They terminate TLS for the hosts of those rules with the server's
	// CA (DATA_DIR/egress-ca.pem), which those sandboxes trust.
	egressCA, err := egress.LoadCA(cfg.DataDir)
	if err != nil {
		return err
	}
	scfg.EgressCA = egressCA.PEM()
	// They mint the sandboxes' workload identity tokens
	// (${identity.token}), signed with DATA_DIR/identity-keys.pem, for
	// the issuer --public-url (internal/identity).
	issuer := cfg.PublicURL
	if issuer == "" {
		issuer = defaultPublicURL(listen)
	}
	if scfg.Identity, err = identity.Load(issuer, cfg.DataDir); err != nil {
		return err
	}
	egressIdentity := server.NewEgressIdentity(egressSecrets, scfg.Identity)
	engineOpts = append(engineOpts, func(c *sandbox.Config) {
		c.Egress.Secrets = egressSecrets
		c.Egress.Identity = egressIdentity
		c.Egress.Intercept = &egress.Intercept{CA: egressCA}
	})
	if n, err := scfg.Secrets.Reseal(ctx); err != nil {
		log.Error("reseal secrets: values sealed under a key missing from the keyring do not open", "err", err)
	} else if n > 0 {
		log.Info("resealed secrets under the newest key", "count", n, "key", keys.Current())
	}
	// On Kubernetes, sandboxes outlive every replica and the others
	// serve them meanwhile: records stay, and the collector ends those
	// whose Pod is gone, and the executions of replicas whose heartbeat
	// lapsed (internal/server/shared.go).
	shared := kube != nil
	if !shared {
		if n, err := st.StopAllRunning(ctx, "server restarted", time.Now()); err != nil {
			return err
		} else if n > 0 {
			log.Info("marked sandboxes of the previous run stopped", "count", n)
		}
		if n, err := st.EndRunningExecutions(ctx, string(apierr.Internal), "server restarted"); err != nil {
			return err
		} else if n > 0 {
			log.Info("marked executions the previous run cut ended", "count", n)
		}
	}
	// 3. The event bus (stored, streamed, posted to webhooks): closed
	// after the engine, so that every sandbox.stopped is kept.
	bcfg.Logger = log
	bus := events.NewBus(server.EventStore(st), bcfg)
	defer bus.Close()
	scfg.Events = bus
	engineOpts = append(engineOpts, func(c *sandbox.Config) { c.Events = bus })
	// Sandboxes with a network never reach the server itself (the host's
	// own addresses are refused too, which covers a wildcard listener).
	if a, err := net.ResolveTCPAddr("tcp", listen); err == nil {
		engineOpts = append(engineOpts, func(c *sandbox.Config) { c.Egress.Self = append(c.Egress.Self, a.AddrPort()) })
	}
	// Sandboxes a crash left are charged, before they are destroyed,
	// what they used since the last metering flush (internal/metering,
	// recover.go).
	if !shared && !scfg.NoAccounting {
		prices := metering.DefaultPrices
		if scfg.Metering.Prices != nil {
			prices = *scfg.Metering.Prices
		}
		recoverer := metering.Recoverer(st, prices, log)
		engineOpts = append(engineOpts, func(c *sandbox.Config) { c.Leftover = recoverer })
	}
	// Paused sandboxes outlive the server's run, on the same data dir
	// (internal/sandbox keep.go, internal/server paused.go).
	if !shared {
		engineOpts = append(engineOpts, func(c *sandbox.Config) { c.KeepPaused = true })
	}
	// 4. The engine.
	var eng *engine
	var kubeRT *kubernetes.Runtime
	if kube == nil {
		eng, err = openEngine(ctx, cfg, instance, idleTimeout, log, engineOpts...)
	} else {
		eng, kubeRT, err = sfengine.OpenKubernetes(ctx, *kube, idleTimeout, log, engineOpts...)
	}
	if err != nil {
		return err
	}
	engineClosed := false
	defer func() {
		if !engineClosed {
			eng.Close(context.Background())
		}
	}()
	// The engine has raised the host's per-user limits: check the rest.
	if kube == nil {
		checkHost(ctx, cfg, scfg.MaxSandboxes, eng.PoolStats().Size, log)
	}
	// 5. HTTP.
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	scfg.Runtime = eng.Runtime.Name()
	scfg.DataDir = cfg.DataDir
	if kube == nil { // RUN steps in runc on this host; a cluster's server builds none
		var self []netip.AddrPort
		if a, err := net.ResolveTCPAddr("tcp", listen); err == nil {
			self = append(self, a.AddrPort())
		}
		runner, err := sfengine.NewStepRunner(cfg, egress.Options{Self: self, Logger: log})
		if err != nil {
			return err
		}
		scfg.TemplateRunner = runner
		scfg.TemplateUIDShift = oci.DefaultIDMap.HostID
		scfg.TemplateRegistries = registriesOf(&cfg)
	}
	if scfg.ShutdownTimeout <= 0 {
		scfg.ShutdownTimeout = 10 * time.Second
	}
	scfg.Cgroups = "v1"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		scfg.Cgroups = "v2"
	}
	scfg.Ready = func(context.Context) error {
		_, err := template.Get(cfg.DataDir, "python")
		return err
	}
	if kubeRT != nil {
		// Ready while the cluster answers. Capacity is the cluster's
		// (its scheduler's), not this host's memory; previews are
		// signed with the replicas' shared key.
		scfg.Ready = kubeRT.Ready
		scfg.HostMemoryBytes = 0
		scfg.PreviewKey = kubeRT.PreviewKey()
	}
	srv := server.New(scfg, st, eng.Manager, log)
	log.Info("listening", "addr", ln.Addr().String(), "data_dir", cfg.DataDir, "runtime", scfg.Runtime)
	fmt.Fprintf(os.Stderr, "sheepfold: serving the API on http://%s/v1\n", ln.Addr())
	if n, err := st.CountActiveKeys(ctx); err == nil && n == 0 {
		fmt.Fprintf(os.Stderr, "sheepfold: there is no API key yet; create one with:\n  sheepfold keys create --data-dir %s --name NAME\n", cfg.DataDir)
	}

	if metricsListen != "" {
		mln, err := net.Listen("tcp", metricsListen)
		if err != nil {
			srv.Shutdown(context.Background())
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", srv.MetricsHandler())
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go ms.Serve(mln)
		defer ms.Close()
		log.Info("serving metrics", "addr", mln.Addr().String())
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err = <-served:
		log.Error("server stopped", "err", err)
	case <-ctx.Done():
		// A second Ctrl-C (SIGINT) ends the process at once. A second
		// SIGTERM does not: supervisors repeat it (timeout(1) signals the
		// whole process group, a parent's Pdeathsig follows) and escalate
		// with SIGKILL, and an exit now would leave every sandbox, its
		// mounts and its cgroups behind (the shutdown destroys them).
		signal.Ignore(syscall.SIGTERM)
		stop()
		srv.Drain()
		log.Info("shutting down: /readyz answers 503; draining requests", "delay", srv.DrainDelay(), "timeout", scfg.ShutdownTimeout)
	}

	// Stop in reverse: HTTP (drain: its delay, then requests in flight
	// for up to --shutdown-timeout), engine, records, events, database.
	dctx, cancel := context.WithTimeout(context.Background(), srv.DrainDelay()+scfg.ShutdownTimeout)
	defer cancel()
	if serr := srv.Shutdown(dctx); serr != nil {
		log.Warn("requests still running at the drain timeout", "err", serr)
	}
	if cerr := eng.Close(context.Background()); cerr != nil {
		log.Error("close engine", "err", cerr)
	}
	engineClosed = true
	if cerr := srv.Close(context.Background()); cerr != nil {
		log.Error("flush usage", "err", cerr)
	}
	srv.RecordStopped(context.Background())
	if !shared {
		if _, serr := st.StopAllRunning(context.Background(), "server shut down", time.Now()); serr != nil {
			log.Error("record sandboxes stopped", "err", serr)
		}
	}
	log.Info("stopped")
	return err
}

// maxOvercommit bounds --overcommit: the host's memory times it stays an
// int64 of bytes.
const maxOvercommit = 1000

// checkFlags returns the first refusal of a flag's value out of its range
// (internal/bound, with the flag for the field), as the CLI words it.
func checkFlags(checks ...error) error {
	for _, err := range checks {
		if err != nil {
			return errors.New(apierr.From(err).Message)
		}
	}
	return nil
}

// noDelay turns a flag's 0 (no delay) into server.Config's -1.
func noDelay(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// noBound turns a flag's 0 (no bound) into server.Config's -1.
func noBound(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// serverInstance names the engine instance of a server on dataDir.
func serverInstance(dataDir string) string {
	if abs, err := filepath.Abs(dataDir); err == nil {
		dataDir = abs
	}
	sum := sha256.Sum256([]byte(filepath.Clean(dataDir)))
	return "server-" + hex.EncodeToString(sum[:4])
}

// storageFlags are the bounds of what each account keeps in the database,
// by kind (server.Config.Storage): --account-storage-KIND records and
// --account-storage-KIND-mb MiB.
type storageFlags struct {
	records, mb map[string]*int64
}

func addStorageFlags(fs *pflag.FlagSet) *storageFlags {
	sf := &storageFlags{records: map[string]*int64{}, mb: map[string]*int64{}}
	what := map[string][2]string{
		store.KindSandboxes:  {"sandbox records", "past it its stopped ones go, first stopped first"},
		store.KindExecutions: {"execution records (with their code and output)", "past it its oldest finished ones go"},
		store.KindEvents:     {"events", "past it its oldest go"},
		store.KindAlerts:     {"alerts", "past it its oldest acknowledged ones go, or a new one is refused (429)"},
		store.KindDeliveries: {"webhook delivery attempts", "past it its oldest go"},
	}
	for _, k := range store.Kinds {
		def := server.DefaultStorage.Of(k)
		sf.records[k] = fs.Int64("account-storage-"+k, def.Records,
			"most "+what[k][0]+" one account keeps in the database; "+what[k][1]+" (-1: no bound)")
		sf.mb[k] = fs.Int64("account-storage-"+k+"-mb", def.Bytes/server.MiB,
			"most MiB of "+what[k][0]+" one account keeps (their text plus 128 bytes a record); "+what[k][1]+" (-1: no bound)")
	}
	return sf
}

// bounds returns the bounds the flags give, refusing 0 (say -1 for none).
func (sf *storageFlags) bounds() (store.Bounds, error) {
	var b store.Bounds
	for _, k := range store.Kinds {
		n, mb := *sf.records[k], *sf.mb[k]
		if n == 0 || n < -1 || mb == 0 || mb < -1 {
			return b, fmt.Errorf("--account-storage-%s and --account-storage-%s-mb must be positive, or -1 for no bound", k, k)
		}
		if mb > math.MaxInt64/server.MiB {
			return b, fmt.Errorf("--account-storage-%s-mb is too large", k)
		}
		a := store.Amount{Records: n, Bytes: mb}
		if mb > 0 {
			a.Bytes = mb * server.MiB
		}
		b.Set(k, a)
	}
	return b, nil
}

// defaultPublicURL is the issuer of a server without --public-url:
// http://LISTEN, localhost for a wildcard or empty host.
func defaultPublicURL(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://localhost"
	}
	if a, err := netip.ParseAddr(host); host == "" || err == nil && a.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}
