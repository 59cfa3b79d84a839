package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sheepfold/sheepfold/internal/config"
	sfengine "github.com/sheepfold/sheepfold/internal/engine"
	"github.com/sheepfold/sheepfold/internal/runtime/oci"
	"github.com/sheepfold/sheepfold/internal/template"
)

// buildDockerfile is `template build -f`.
func buildDockerfile(ctx context.Context, cfg *config.Config, name, file, contextDir string, buildArgs []string,
	noCache, quiet bool, logFile string) error {
	if cfg.RuntimePath == "" {
		cfg.RuntimePath = filepath.Join(cfg.DataDir, "bin", "runc")
	}
	var src []byte
	var err error
	if file == "-" {
		src, err = io.ReadAll(os.Stdin)
	} else {
		src, err = os.ReadFile(file)
	}
	if err != nil {
		return err
	}
	if contextDir == "" && file != "-" {
		contextDir = filepath.Dir(file)
	}
	if contextDir != "" {
		if contextDir, err = filepath.Abs(contextDir); err != nil {
			return err
		}
	}
	args := map[string]string{}
	for _, a := range buildArgs {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			v, ok = os.LookupEnv(k)
		}
		if ok {
			args[k] = v
		}
	}
	opt := template.DockerfileOptions{
		DataDir: cfg.DataDir, Name: name, Context: contextDir, BuildArgs: args,
		UIDShift: oci.DefaultIDMap.HostID, Runner: sfengine.StepRunner(*cfg), NoCache: noCache,
	}
	var logs []io.Writer
	if !quiet {
		logs = append(logs, os.Stderr)
	}
	if logFile != "" {
		f, err := os.Create(logFile)
		if err != nil {
			return err
		}
		defer f.Close()
		logs = append(logs, f)
	}
	if len(logs) > 0 {
		opt.Log = io.MultiWriter(logs...)
	}
	start := time.Now()
	info, err := template.BuildDockerfile(ctx, src, opt)
	if err != nil {
		return err
	}
	fmt.Printf("template %s ready at %s (%d MiB, %s, %s)\n", info.Name, info.Path, info.SizeBytes>>20,
		time.Since(start).Round(100*time.Millisecond), info.Hash)
	return nil
}
