package main

import (
	"github.com/spf13/cobra"

	"github.com/cudatrace/cudatrace/record"
)

// launchCmdName is the hidden verb `record -- CMD` re-executes itself as: it
// waits until the tracer has put its PID in the filter, then execs CMD, so
// that the command's first allocation is already traced.
const launchCmdName = "__launch"

func newLaunchCmd() *cobra.Command {
	return &cobra.Command{
		Use:                launchCmdName + " -- COMMAND [ARGS...]",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			return record.LaunchMain(args)
		},
	}
}
