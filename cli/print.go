package cli

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/admin"
)

// How the admin commands print what the API answers.

func (c *adminClient) printJSON(raw []byte) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	c.out.Write(raw)
	fmt.Fprintln(c.out)
}

// sendName is t's id, with its send number when it is a later send of an
// id pending more than once (docs/contract.md §2.4).
func sendName(t *admin.TimeoutJSON) string {
	if t.Send > 1 {
		return t.ID + " (send " + strconv.Itoa(t.Send) + ")"
	}
	return t.ID
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n-1] + "…"
	}
	return s
}

// table is a table of columns printed to c.out when flushed.
func (c *adminClient) table() *tabwriter.Writer {
	return tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
}

// fields prints one thing (show) as "name: value" rows, aligned when
// flushed.
type fields struct{ *tabwriter.Writer }

func (c *adminClient) fields() fields { return fields{c.table()} }

func (f fields) row(k string, v any) { fmt.Fprintf(f, "%s:\t%v\n", k, v) }

// printMessage prints a message's properties and headers as rows of f,
// flushes it, then prints the body.
func (c *adminClient) printMessage(f fields, msg *admin.MessageJSON) {
	if p := msg.Properties; p != nil {
		b, _ := json.Marshal(p)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			f.row("property "+k, m[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(msg.Headers)) {
		v := msg.Headers[k]
		if _, ok := v.(string); !ok {
			b, _ := json.Marshal(v)
			v = string(b)
		}
		f.row("header "+k, v)
	}
	f.Flush()
	if msg.BodyBase64 != nil {
		body, _ := base64.StdEncoding.DecodeString(*msg.BodyBase64)
		fmt.Fprintf(c.out, "body (%d bytes):\n", len(body))
		if isPrintable(body) {
			fmt.Fprintln(c.out, string(body))
		} else {
			fmt.Fprintf(c.out, "(binary, base64) %s\n", *msg.BodyBase64)
		}
	}
}

func isPrintable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if (r < 0x20 && r != '\n' && r != '\r' && r != '\t') || r == 0x7f {
			return false
		}
	}
	return true
}

func (c *adminClient) printBulk(raw []byte, res *admin.BulkJSON, verb string) {
	if c.json {
		c.printJSON(raw)
		return
	}
	n := 0
	for _, p := range []*int{res.Cancelled, res.Dispatched, res.Rescheduled} {
		if p != nil {
			n = *p
		}
	}
	fmt.Fprintf(c.out, "%s %d timeouts\n", verb, n)
	if res.Leased > 0 {
		fmt.Fprintf(c.out, "%d more were being dispatched and were left alone\n", res.Leased)
	}
	if res.OutOfRange != nil && *res.OutOfRange > 0 {
		fmt.Fprintf(c.out, "%d more were left alone: the shift would move them past the latest due time the bridge keeps\n", *res.OutOfRange)
	}
}

// printSkipped prints a replay's skipped messages.
func (c *adminClient) printSkipped(skipped []admin.ReplaySkipped) {
	if len(skipped) == 0 {
		return
	}
	tw := c.table()
	fmt.Fprintln(tw, "SKIPPED MESSAGE-ID\tREASON")
	for _, d := range skipped {
		fmt.Fprintf(tw, "%s\t%s\n", d.MessageID, d.Reason)
	}
	tw.Flush()
}
