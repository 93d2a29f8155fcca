package main

import (
	"os/exec"
	"runtime"
	"syscall"
)

// childAttr puts the child in its own process group and has the kernel send
// it SIGTERM if this process dies without forwarding anything (SIGKILL).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// startChild starts cmd from a thread that stays alive: Pdeathsig fires when
// the thread that forked exits, not the process.
func startChild(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	return cmd.Start()
}
