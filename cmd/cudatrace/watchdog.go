package main

import (
	"github.com/spf13/cobra"

	"github.com/cudatrace/cudatrace/internal/watchdog"
)

// watchdogCmdName is the hidden verb `record -- CMD` starts beside itself:
// it resumes the processes BPF stopped for the reader if the tracer dies
// before resuming them (internal/watchdog).
const watchdogCmdName = "__watchdog"

func newWatchdogCmd() *cobra.Command {
	return &cobra.Command{
		Use:                watchdogCmdName,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return watchdog.Main(cmd.ErrOrStderr())
		},
	}
}
