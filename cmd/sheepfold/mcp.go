package main

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/sheepfold/sheepfold/internal/mcpserver"
)

// mcpCmd serves the MCP tools over stdio, acting on a running server with
// the caller's key (a desktop agent starts it as a subprocess).
func mcpCmd() *cobra.Command {
	r := &remote{}
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve sandbox tools to an agent over the Model Context Protocol on stdio",
		Long: "mcp speaks MCP on stdin and stdout and acts on a running server with your API key:\n" +
			"create_sandbox, run_code, run_command, read_file, write_file, list_files, kill_sandbox.\n" +
			"The server serves the same tools over streamable HTTP at /mcp.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := r.client()
			if err != nil {
				return err
			}
			return mcpserver.New(c, version).Run(cmd.Context(), &mcp.StdioTransport{})
		},
	}
	r.flags(cmd)
	return cmd
}
