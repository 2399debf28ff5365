package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
)

// scriptedSweeper answers SweepUnreadable from a script, one step per call.
type scriptedSweeper struct {
	steps []struct {
		moved int
		err   error
	}
	calls int
}

func (s *scriptedSweeper) SweepUnreadable(context.Context, string) (int, error) {
	step := s.steps[min(s.calls, len(s.steps)-1)]
	s.calls++
	return step.moved, step.err
}

func (s *scriptedSweeper) Wait(context.Context) (*amqp.Connection, error) {
	return nil, errors.New("not used")
}

func script(steps ...any) *scriptedSweeper {
	s := &scriptedSweeper{}
	for i := 0; i < len(steps); i += 2 {
		err, _ := steps[i+1].(error)
		s.steps = append(s.steps, struct {
			moved int
			err   error
		}{steps[i].(int), err})
	}
	return s
}

func TestSweepUnreadableRetriesABoundedNumberOfTimes(t *testing.T) {
	opts := ConsumeOptions{Queue: "q", Name: "test", MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
		Logger: zerolog.New(zerolog.NewTestWriter(t))}
	failing := errors.New("broker unreachable")
	for _, tc := range []struct {
		name      string
		sweeper   *scriptedSweeper
		moved     int
		wantCalls int
	}{
		{"moved at once", script(2, nil), 2, 1},
		// The broker requeues the dead consumer's messages a moment later.
		{"nothing, then moved", script(0, nil, 1, nil), 1, 2},
		{"failing, then moved", script(0, failing, 1, nil), 1, 2},
		{"always failing", script(0, failing), 0, sweepAttempts},
		{"never finding anything", script(0, nil), 0, sweepAttempts},
		{"a failure after moving some", script(1, failing), 1, 1},
		{"no sweeper configured", script(0, errNoSweeper), 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sweepUnreadable(context.Background(), tc.sweeper, opts); got != tc.moved || tc.sweeper.calls != tc.wantCalls {
				t.Errorf("moved %d in %d sweeps, want %d in %d", got, tc.sweeper.calls, tc.moved, tc.wantCalls)
			}
		})
	}
	t.Run("stops with the context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		s := script(0, failing)
		if got := sweepUnreadable(ctx, s, opts); got != 0 || s.calls != 1 {
			t.Errorf("moved %d in %d sweeps after the context ended, want 0 in 1", got, s.calls)
		}
	})
}

func TestUnreadableFrameIsOnlyTheClientsParseFailure(t *testing.T) {
	for _, tc := range []struct {
		e    *amqp.Error
		want bool
	}{
		{&amqp.Error{Code: amqp.FrameError, Reason: amqp.ErrSyntax.Error()}, true},
		{nil, false},
		{&amqp.Error{Code: amqp.FrameError, Reason: "EOF"}, false},                                       // the network
		{&amqp.Error{Code: amqp.FrameError, Reason: amqp.ErrSyntax.Error(), Server: true}, false},        // the broker's frame_error
		{&amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - closed by admin"}, false}, // an operator
	} {
		if got := unreadableFrame(tc.e); got != tc.want {
			t.Errorf("unreadableFrame(%v) = %v, want %v", tc.e, got, tc.want)
		}
	}
}
