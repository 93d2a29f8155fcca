//go:build !linux

package main

import (
	"os/exec"
	"syscall"
)

// childAttr puts the child in its own process group.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func startChild(cmd *exec.Cmd) error { return cmd.Start() }
