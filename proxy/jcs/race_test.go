//go:build race

package jcs

const raceEnabled = true
