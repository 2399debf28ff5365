package broker

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delaybridge/delaybridge/internal/codec"
)

// errMalformed is a frame or field that does not follow the protocol.
var errMalformed = codec.ErrMalformedAMQP

// rawConn is a minimal AMQP 0-9-1 client on one channel: enough to take
// messages with basic.get and settle them, reading their content headers as
// bytes. It exists because amqp091-go closes the whole connection on a
// content header it refuses to read (readable.go), so it cannot take such a
// message off a queue. It is not safe for concurrent use.
type rawConn struct {
	nc       net.Conn
	r        *bufio.Reader
	w        *bufio.Writer
	frameMax uint32
	timeout  time.Duration // for each exchange with the broker
	stop     func() bool   // detaches the context watch
}

const rawChannel = 1

// Method ids (class, method) the sweep uses.
var (
	mConnStart    = [2]uint16{10, 10}
	mConnSecure   = [2]uint16{10, 20}
	mConnTune     = [2]uint16{10, 30}
	mConnOpenOK   = [2]uint16{10, 41}
	mConnClose    = [2]uint16{10, 50}
	mConnCloseOK  = [2]uint16{10, 51}
	mChanOpenOK   = [2]uint16{20, 11}
	mChanClose    = [2]uint16{20, 40}
	mBasicQosOK   = [2]uint16{60, 11}
	mBasicGetOK   = [2]uint16{60, 71}
	mBasicGetNone = [2]uint16{60, 72}
)

// errBrokerClosed is the broker closing the connection or channel.
var errBrokerClosed = errors.New("the broker closed the connection")

// dialRaw connects to rawURL as amqp091-go would (same URL syntax, TLS
// config, SASL mechanisms PLAIN and EXTERNAL) and opens channel 1. Errors
// never contain the password. ctx cancels every later exchange too, until
// close.
func dialRaw(ctx context.Context, rawURL string, tlsCfg *tls.Config, name string, timeout time.Duration) (_ *rawConn, err error) {
	uri, err := amqp.ParseURI(rawURL)
	if err != nil {
		// Not the parser's error: it may quote the URL, password and all.
		return nil, fmt.Errorf("connect to %s: the URL cannot be parsed", Redact(rawURL))
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("connect to %s: %w", Redact(rawURL), err)
		}
	}()
	nc, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)))
	if err != nil {
		return nil, err
	}
	if uri.Scheme == "amqps" {
		cfg, err := rawTLSConfig(uri, tlsCfg)
		if err != nil {
			_ = nc.Close()
			return nil, err
		}
		tc := tls.Client(nc, cfg)
		hctx, cancel := context.WithTimeout(ctx, timeout)
		err = tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			_ = nc.Close()
			return nil, err
		}
		nc = tc
	}
	rc := &rawConn{nc: nc, r: bufio.NewReader(nc), w: bufio.NewWriter(nc), frameMax: 4096, timeout: timeout}
	// Cancelling ctx fails the exchange under way at once.
	rc.stop = context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	if err := rc.handshake(uri, name); err != nil {
		rc.abort()
		return nil, err
	}
	return rc, nil
}

// rawTLSConfig is the bridge's TLS config or, without one, the URL's TLS
// parameters as amqp091-go reads them.
func rawTLSConfig(uri amqp.URI, cfg *tls.Config) (*tls.Config, error) {
	if cfg != nil {
		cfg = cfg.Clone()
	} else {
		files := TLSFiles{CAFile: uri.CACertFile, CertFile: uri.CertFile, KeyFile: uri.KeyFile, ServerName: uri.ServerName}
		var err error
		if cfg, err = files.Config(); err != nil {
			return nil, err
		}
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
	if cfg.ServerName == "" {
		cfg.ServerName = uri.Host
	}
	return cfg, nil
}

// handshake runs connection.start … connection.open and channel.open.
func (rc *rawConn) handshake(uri amqp.URI, name string) error {
	rc.deadline()
	if _, err := rc.w.WriteString("AMQP\x00\x00\x09\x01"); err != nil {
		return err
	}
	if err := rc.w.Flush(); err != nil {
		return err
	}
	start, err := rc.expect(0, mConnStart)
	if err != nil {
		return err
	}
	d := codec.NewDecoder(start, errMalformed)
	d.Byte() // version
	d.Byte()
	d.LongBytes() // server properties
	offered := strings.Fields(string(d.LongBytes()))
	if d.Err() != nil {
		return fmt.Errorf("connection.start: %w", d.Err())
	}
	mech, response, err := saslFor(uri, offered)
	if err != nil {
		return err
	}
	b := codec.AppendLongBytes(nil, clientProperties(name))
	b = codec.AppendShortString(b, mech)
	b = codec.AppendLongBytes(b, []byte(response))
	b = codec.AppendShortString(b, "en_US")
	if err := rc.send(0, 10, 11, b); err != nil {
		return err
	}
	tune, err := rc.expect(0, mConnTune)
	if err != nil {
		return err
	}
	d = codec.NewDecoder(tune, errMalformed)
	channelMax, frameMax := d.U16(), d.U32()
	if d.Err() != nil {
		return fmt.Errorf("connection.tune: %w", d.Err())
	}
	if frameMax == 0 || frameMax > 1<<20 {
		frameMax = 1 << 17 // amqp091-go's default
	}
	rc.frameMax = frameMax
	b = binary.BigEndian.AppendUint16(nil, channelMax)
	b = binary.BigEndian.AppendUint32(b, frameMax)
	b = binary.BigEndian.AppendUint16(b, 0) // no heartbeats: every exchange has a deadline instead
	if err := rc.send(0, 10, 31, b); err != nil {
		return err
	}
	b = codec.AppendShortString(nil, uri.Vhost)
	b = codec.AppendShortString(b, "")
	b = append(b, 0)
	if err := rc.send(0, 10, 40, b); err != nil {
		return err
	}
	if _, err := rc.expect(0, mConnOpenOK); err != nil {
		return err
	}
	if err := rc.send(rawChannel, 20, 10, codec.AppendShortString(nil, "")); err != nil {
		return err
	}
	_, err = rc.expect(rawChannel, mChanOpenOK)
	return err
}

// clientProperties is the start-ok's client-properties table. The
// capability asks the broker to say why it refuses a login (a
// connection.close) rather than just close the socket.
func clientProperties(name string) []byte {
	caps := codec.AppendShortString(nil, "authentication_failure_close")
	caps = append(caps, 't', 1)
	var t []byte
	for _, kv := range [][2]string{{"connection_name", name}, {"product", "delaybridge sweep"}} {
		t = codec.AppendShortString(t, kv[0])
		t = codec.AppendLongBytes(append(t, 'S'), []byte(kv[1]))
	}
	t = codec.AppendShortString(t, "capabilities")
	return codec.AppendLongBytes(append(t, 'F'), caps)
}

// saslFor picks the mechanism as amqp091-go does: the URL's auth_mechanism
// list in order (PLAIN by default), the first one the broker offers.
func saslFor(uri amqp.URI, offered []string) (mech, response string, err error) {
	wanted := uri.AuthMechanism
	if len(wanted) == 0 {
		wanted = []string{"PLAIN"}
	}
	for _, w := range wanted {
		w = strings.ToUpper(w)
		for _, o := range offered {
			if o != w {
				continue
			}
			switch w {
			case "PLAIN":
				return w, "\x00" + uri.Username + "\x00" + uri.Password, nil
			case "EXTERNAL":
				return w, "", nil
			}
		}
	}
	return "", "", fmt.Errorf("no supported SASL mechanism among %v (the broker offers %v)", wanted, offered)
}

// deadline bounds the next exchange.
func (rc *rawConn) deadline() { _ = rc.nc.SetDeadline(time.Now().Add(rc.timeout)) }

// send writes one method frame and flushes.
func (rc *rawConn) send(channel, class, method uint16, args []byte) error {
	rc.deadline()
	if err := rc.write(channel, class, method, args); err != nil {
		return err
	}
	return rc.w.Flush()
}

// write buffers one method frame.
func (rc *rawConn) write(channel, class, method uint16, args []byte) error {
	payload := make([]byte, 0, 4+len(args))
	payload = append(payload, byte(class>>8), byte(class), byte(method>>8), byte(method))
	payload = append(payload, args...)
	return codec.WriteFrame(rc.w, codec.FrameMethod, channel, payload)
}

// next reads the next frame that is not a heartbeat.
func (rc *rawConn) next() (codec.Frame, error) {
	for {
		f, err := codec.ReadFrame(rc.r, rc.frameMax)
		if err != nil {
			return codec.Frame{}, err
		}
		if f.Type != codec.FrameHeartbeat {
			return f, nil
		}
	}
}

// method reads the next frame, which must be a method; a connection.close
// or channel.close from the broker becomes an error naming its reply.
func (rc *rawConn) method() (id [2]uint16, args []byte, err error) {
	rc.deadline()
	f, err := rc.next()
	if err != nil {
		return id, nil, err
	}
	if f.Type != codec.FrameMethod || len(f.Payload) < 4 {
		return id, nil, fmt.Errorf("%w: frame type %d where a method was expected", errMalformed, f.Type)
	}
	id = [2]uint16{uint16(f.Payload[0])<<8 | uint16(f.Payload[1]), uint16(f.Payload[2])<<8 | uint16(f.Payload[3])}
	args = f.Payload[4:]
	switch id {
	case mConnClose, mChanClose:
		d := codec.NewDecoder(args, errMalformed)
		code, text := d.U16(), d.ShortString()
		if id == mConnClose {
			_ = rc.send(0, 10, 51, nil)
		} else {
			_ = rc.send(rawChannel, 20, 41, nil)
		}
		return id, nil, fmt.Errorf("%w: %d %s", errBrokerClosed, code, text)
	}
	return id, args, nil
}

// expect reads the next method and requires it to be want.
func (rc *rawConn) expect(channel uint16, want [2]uint16) ([]byte, error) {
	id, args, err := rc.method()
	if err != nil {
		return nil, err
	}
	if id == mConnSecure {
		return nil, errors.New("the broker asks for a SASL challenge, which is not supported")
	}
	if id != want {
		return nil, fmt.Errorf("%w: method %d.%d where %d.%d was expected", errMalformed, id[0], id[1], want[0], want[1])
	}
	return args, nil
}

// rawMessage is one message taken with basic.get.
type rawMessage struct {
	tag uint64
	// props is the content header after class, weight and body size: the
	// property flags and list, exactly as the broker sent them.
	props []byte
	body  []byte // only when get's keep asked for it
}

// get takes the next message of queue without acknowledging it; ok is false
// when the queue is empty. keep, given the message's properties, says
// whether to keep its body: the others are read and dropped.
func (rc *rawConn) get(queue string, keep func(props []byte) bool) (_ rawMessage, ok bool, err error) {
	b := codec.AppendShortString(binary.BigEndian.AppendUint16(nil, 0), queue)
	b = append(b, 0) // no-ack off
	if err := rc.send(rawChannel, 60, 70, b); err != nil {
		return rawMessage{}, false, err
	}
	id, args, err := rc.method()
	switch {
	case err != nil:
		return rawMessage{}, false, err
	case id == mBasicGetNone:
		return rawMessage{}, false, nil
	case id != mBasicGetOK:
		return rawMessage{}, false, fmt.Errorf("%w: method %d.%d after basic.get", errMalformed, id[0], id[1])
	}
	d := codec.NewDecoder(args, errMalformed)
	m := rawMessage{tag: d.U64()}
	if d.Err() != nil {
		return rawMessage{}, false, fmt.Errorf("basic.get-ok: %w", d.Err())
	}
	f, err := rc.next()
	if err != nil {
		return rawMessage{}, false, err
	}
	if f.Type != codec.FrameHeader || len(f.Payload) < 14 {
		return rawMessage{}, false, fmt.Errorf("%w: frame type %d where a content header was expected", errMalformed, f.Type)
	}
	size := binary.BigEndian.Uint64(f.Payload[4:12])
	m.props = f.Payload[12:]
	keepBody := keep(m.props)
	for read := uint64(0); read < size; {
		rc.deadline()
		f, err := rc.next()
		if err != nil {
			return rawMessage{}, false, err
		}
		if f.Type != codec.FrameBody {
			return rawMessage{}, false, fmt.Errorf("%w: frame type %d inside a message body", errMalformed, f.Type)
		}
		read += uint64(len(f.Payload))
		if keepBody {
			m.body = append(m.body, f.Payload...)
		}
	}
	return m, true, nil
}

// ack acknowledges one message.
func (rc *rawConn) ack(tag uint64) error {
	return rc.send(rawChannel, 60, 80, append(binary.BigEndian.AppendUint64(nil, tag), 0))
}

// requeueUpTo returns every unacknowledged message up to tag to the queue.
func (rc *rawConn) requeueUpTo(tag uint64) error {
	// multiple, requeue
	return rc.send(rawChannel, 60, 120, append(binary.BigEndian.AppendUint64(nil, tag), 0b11))
}

// requeue returns the messages with these tags to the queue, each with a
// nack of its own, so that the others taken on the channel stay held. When
// it returns the broker has handled the nacks: a basic.qos round trip
// follows them on the channel, so a basic.get sent afterwards on any
// connection finds the messages back.
func (rc *rawConn) requeue(tags []uint64) error {
	rc.deadline()
	for _, tag := range tags {
		// requeue, not multiple
		if err := rc.write(rawChannel, 60, 120, append(binary.BigEndian.AppendUint64(nil, tag), 0b10)); err != nil {
			return err
		}
	}
	// prefetch size 0, prefetch count 0 (basic.get is not limited by it
	// anyway), not global
	if err := rc.send(rawChannel, 60, 10, make([]byte, 4+2+1)); err != nil {
		return err
	}
	_, err := rc.expect(rawChannel, mBasicQosOK)
	return err
}

// close closes the connection politely; what is unacknowledged goes back
// to its queue either way.
func (rc *rawConn) close() error {
	// reply code 200, empty reply text, class 0, method 0
	b := binary.BigEndian.AppendUint16(nil, 200)
	b = codec.AppendShortString(b, "")
	err := rc.send(0, 10, 50, append(b, 0, 0, 0, 0))
	for err == nil {
		var id [2]uint16
		if id, _, err = rc.method(); id == mConnCloseOK {
			break
		}
	}
	rc.abort()
	if errors.Is(err, errBrokerClosed) {
		err = nil
	}
	return err
}

// abort drops the connection.
func (rc *rawConn) abort() {
	rc.stop()
	_ = rc.nc.Close()
}
