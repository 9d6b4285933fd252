package service

import (
	"errors"
	"strings"
	"testing"
)

type roleConfig struct {
	Process `envPrefix:""`
	Role    string `env:"TEST_LOAD_ROLE" envDefault:"all"`
}

func (c *roleConfig) Complete(args []string) error {
	if len(args) == 1 {
		c.Role = args[0]
	}
	if c.Role == "nothing" {
		return errors.New("ROLE nothing: want all or relay")
	}
	return nil
}

// Load reads the environment first and then hands the arguments to the
// config's Complete, whose verdict is the configuration's: an argument
// overrides the variable, and a refusal is Load's error.
func TestLoadCompletesTheConfigWithTheArgumentsAfterTheEnvironment(t *testing.T) {
	t.Setenv("TEST_LOAD_ROLE", "relay")
	cfg, err := Load[roleConfig](nil)
	if err != nil || cfg.Role != "relay" {
		t.Fatalf("no arguments: role %q, %v; want the variable's relay", cfg.Role, err)
	}
	cfg, err = Load[roleConfig]([]string{"all"})
	if err != nil || cfg.Role != "all" {
		t.Fatalf("argument all: role %q, %v; want all", cfg.Role, err)
	}
	if _, err := Load[roleConfig]([]string{"nothing"}); err == nil || !strings.Contains(err.Error(), "ROLE nothing") {
		t.Fatalf("argument nothing: %v, want Complete's refusal", err)
	}
}

// Two nested settings with the same Go field name (a consumer's and a
// relay's BatchSize) are told apart: a malformed value is blamed on the
// variable that holds it, not on whichever of the two was mapped last.
func TestAMalformedValueNamesItsOwnVariableWhenFieldNamesRepeat(t *testing.T) {
	type part struct {
		BatchSize int `env:"BATCH_SIZE" envDefault:"10"`
	}
	type config struct {
		Consumer part `envPrefix:"CONSUMER_"`
		Relay    part `envPrefix:"RELAY_"`
	}
	t.Setenv("CONSUMER_BATCH_SIZE", "abc")
	_, err := LoadConfig[config]()
	if err == nil || !strings.Contains(err.Error(), "CONSUMER_BATCH_SIZE") || strings.Contains(err.Error(), "RELAY_BATCH_SIZE") {
		t.Errorf("CONSUMER_BATCH_SIZE=abc: %v; want an error naming CONSUMER_BATCH_SIZE and only it", err)
	}
	t.Setenv("RELAY_BATCH_SIZE", "many")
	_, err = LoadConfig[config]()
	if err == nil || !strings.Contains(err.Error(), "CONSUMER_BATCH_SIZE") || !strings.Contains(err.Error(), "RELAY_BATCH_SIZE") {
		t.Errorf("both malformed: %v; want an error naming both", err)
	}
}
