package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cudatrace/cudatrace/internal/watchdog"
)

// watchdogCmdName is the hidden verb record, top and the agent start
// beside themselves: it resumes the processes BPF stopped for the reader
// if the tracer dies before resuming them (internal/watchdog).
const watchdogCmdName = "__watchdog"

// watchdogArgv is record.Options.Watchdog: this binary's watchdog verb.
func watchdogArgv() ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	return []string{exe, watchdogCmdName}, nil
}

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
